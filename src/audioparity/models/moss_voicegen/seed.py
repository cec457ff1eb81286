"""The MOSS seed tool's inputs, from a reference dump of ours (``audioparity export --format
seed``).

The seed (audio.cpp's ``moss_voicegen_backbone_parity``, ``../shared/seeds``) renders the
prompt itself and compares its last hidden state with the reference's. It reads:

- ``--prompt`` ``prompt.json``: ``{"text", "instruction", "language"}``, each a string (it
  requires all three), the generation request the dump was made from;
- ``--hidden`` ``hidden.json``: ``{"rows": number of prompt rows, "last_hidden": [H floats]}``,
  the final hidden state at the last prompt row.

The request is the reference manifest's ``request`` (the prompt file's fields); a dump written
before that field existed is read from its prompt file (the manifest's ``inputs.prompt``, when
the file is there with the same sha256).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump, sha256_of
from audioparity.models.moss_voicegen.spec import SPEC, Names
from audioparity.models.moss_voicegen.text_processor import PROMPT_KEYS, load_prompt

#: The files :func:`write_seed` writes.
FILES = ("prompt.json", "hidden.json")


def _request(dump: Dump) -> dict[str, Any]:
    """The generation request of ``dump``: its manifest's ``request``, else its prompt file.

    Raises:
        AudioparityError: neither is there (or the file changed since the dump).
    """
    request = dump.manifest.get("request")
    if isinstance(request, dict):
        return {key: request.get(key) for key in PROMPT_KEYS}
    source = dump.manifest.get("inputs", {}).get(SPEC.input, {})
    path = Path(str(source.get("path", "")))
    if not source.get("path") or not path.is_file() or sha256_of(path) != source.get("sha256"):
        raise AudioparityError(f"{dump.path}: the manifest has no 'request' and its prompt file "
                               f"{source.get('path')!r} is not there as dumped; the MOSS seed "
                               "format needs the request's text, instruction and language")
    prompt = load_prompt(path)
    return {key: getattr(prompt, key) for key in PROMPT_KEYS}


def seed_inputs(dump: Dump) -> dict[str, dict[str, Any]]:
    """The seed's documents of ``dump`` by file name (module docstring).

    Raises:
        AudioparityError: the dump lacks the ``prompt`` document (with its ``rows``), the
            ``last_hidden`` tensor ``[H]`` or the request (:func:`_request`), or the request's
            ``instruction`` or ``language`` is absent (the seed requires strings).
    """
    missing = [name for name in (Names.PROMPT, Names.LAST_HIDDEN) if not dump.has(name)]
    if missing:
        raise AudioparityError(f"{dump.path}: no {', '.join(missing)}; the MOSS seed format "
                               "needs the prompt document and last_hidden")
    prompt = dump.json(Names.PROMPT)
    rows = prompt.get("rows") if isinstance(prompt, dict) else None
    if not isinstance(rows, list):
        raise AudioparityError(f"{dump.path}: the prompt document has no 'rows' list")
    last_hidden = dump.tensor(Names.LAST_HIDDEN)
    if last_hidden.ndim != 1:
        raise AudioparityError(f"{dump.path}: last_hidden is {list(last_hidden.shape)}; "
                               "expected [H]")
    request = _request(dump)
    absent = [key for key in PROMPT_KEYS if not isinstance(request[key], str)]
    if absent:
        raise AudioparityError(f"{dump.path}: the prompt has no {' or '.join(absent)}; the MOSS "
                               "seed's --prompt needs text, instruction and language as strings")
    return {"prompt.json": request,
            "hidden.json": {"rows": len(rows), "last_hidden": last_hidden.tolist()}}


def write_seed(dump: Dump, folder: Path) -> list[str]:
    """Write :func:`seed_inputs` of ``dump`` into ``folder`` (an existing folder) as UTF-8 JSON;
    the file names written.

    Raises:
        AudioparityError: as :func:`seed_inputs`, before anything is written.
    """
    files = seed_inputs(dump)
    for name, document in files.items():
        (Path(folder) / name).write_text(json.dumps(document, ensure_ascii=False, indent=1)
                                         + "\n", encoding="utf-8")
    return list(files)
