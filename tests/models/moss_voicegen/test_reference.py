"""The torch reference of MOSS: the checkpoint's own modeling code (trust_remote_code) gives the
built-in modeling's dump, and the dump equals what the checkpoint's own ``forward`` computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import dump_reference
from audioparity.models.moss_voicegen.config import load_config
from tests.models.moss_voicegen import FAMILY, PROMPT, options


def test_remote_code_reference_equals_the_built_in_one(tmp_path: Path, fixture_model,
                                                       moss_references: dict[str, Dump]) -> None:
    remote_model = fixture_model("moss_voicegen", remote_code=True)
    dump_reference(FAMILY, remote_model, [(PROMPT, tmp_path / "reference_remote")],
                   options=options("reference"))
    remote, built_in = Dump(tmp_path / "reference_remote"), moss_references[PROMPT.stem]
    assert remote.manifest["modeling"] == "trust_remote_code"
    assert built_in.manifest["modeling"] == "built-in"
    for name in built_in.tensor_names:
        np.testing.assert_array_equal(remote.tensor(name), built_in.tensor(name), err_msg=name)
    assert remote.json("prompt") == built_in.json("prompt")
    assert remote.json("generation") == built_in.json("generation")


def test_checkpoint_code_forward_gives_the_dumped_heads(moss_model: Path,
                                                        moss_references: dict[str, Dump]) -> None:
    """The ``MossTTSDelayModel.forward`` a checkpoint ships (as transformers users call it)
    agrees with the reference dump, which drives the same modules one by one."""
    import torch

    from audioparity.models.moss_voicegen.references.remote_code import load_model

    ref = moss_references[PROMPT.stem]
    net = load_model(moss_model, load_config(moss_model))
    rows = torch.tensor(ref.json("prompt")["rows"])[None]
    with torch.inference_mode():
        logits = net(input_ids=rows).logits
    np.testing.assert_array_equal(logits[0][0, -1].numpy(), ref.tensor("text_logits"))
    audio = torch.stack([head[0, -1] for head in logits[1:]]).numpy()
    np.testing.assert_array_equal(audio, ref.tensor("audio_logits"))
