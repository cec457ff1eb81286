"""The ggml dump of a MOSS-VoiceGenerator checkpoint (producer ``ggml``).

Same tensor and document names and layouts as the reference dump
(:mod:`audioparity.models.moss_voicegen.reference`), computed by the ggml backbone
(:mod:`.backbone`) on the rows of our own text processor (:mod:`.text_processor`):

- document ``prompt``: ``{"text", "rows"}`` from our text processor;
- ``last_hidden`` ``[H]``, ``probe_hidden`` ``[3, H]`` (rows ``[0, 1, S//2]``), ``layer_{i}``
  ``[S, H]``, ``text_logits`` ``[vocab_size]``, ``audio_logits`` ``[n_vq, audio_vocab_size+1]``:
  one prefill of all ``S`` rows;
- ``step_last_hidden`` ``[H]``: prefill of rows ``0..S-2``, then row ``S-1`` as one cached step;
- document ``generation``: greedy rows after the full prefill (:mod:`.delay_pattern`), schema::

      {"rows": [[text, code_0, ..., code_{n_vq-1}], ...],  # <= requested_rows rows, int
       "requested_rows": N, "stopped": bool,  # stopped: im_end emitted (then rows < N)
       "n_vq": int, "audio_pad_code": int, "rules": str}

- ``generation_margins`` ``[rows, 1+n_vq]``: per generated value, its argmax margin (chosen
  minus runner-up logit, after the rules' masks); ``+inf`` where the rules force the value, NaN
  where the logits were not finite.

Manifest fields: ``family`` (``moss_voicegen``), ``weight_type``, ``backend``, ``device``,
``kv_cache_type``, ``threads``, ``n_layers``, ``generate_rows``, ``ggml_build``,
``device_description``; notes record the storage type
of each weight group and whether every codebook's pad row is zero. A backend not built into
this ggml gives a manifest with status ``unavailable`` and nothing else.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from audioparity.artifacts import DumpWriter
from audioparity.errors import AudioparityError
from audioparity.ggml import Runtime, open_runtime
from audioparity.models.moss_voicegen import text_processor, weights
from audioparity.models.moss_voicegen.backbone import Backbone
from audioparity.models.moss_voicegen.config import load_config
from audioparity.models.moss_voicegen.stages import write_generation, write_prefill

log = logging.getLogger("audioparity")


def dump_ggml(model: Path, prompt: Path, output_dir: Path, *, weight_type: str, backend: str,
              device: int = 0, threads: int = 1, kv_cache_type: str = "f32",
              generate_rows: int = 16, weights_file: Path | None = None) -> None:
    """Write the ggml dump directory (contents in the module docstring).

    Args:
        model: checkpoint directory.
        prompt: prompt JSON (:func:`.text_processor.load_prompt`).
        output_dir: dump directory (written atomically).
        weight_type: ``native|f32|f16|bf16|q8_0`` for every matrix (norm weights stay f32).
        backend: ``cpu|cuda|vulkan``; ``device``: its device index.
        kv_cache_type: ``f32`` or ``f16``.
        threads: CPU threads.
        generate_rows: rows of greedy generation.
        weights_file: the weights converted once (:func:`~.weights.save_weights` at the same
            type), mapped instead of read from the checkpoint.

    Raises:
        AudioparityError: unreadable config, prompt or weights; a prompt shorter than 3 rows;
            a weight type the shapes cannot hold.
    """
    model, prompt = Path(model), Path(prompt)
    config = load_config(model)
    request = text_processor.load_prompt(prompt)
    fields = {"family": "moss_voicegen", "weight_type": weight_type, "backend": backend,
              "device": device, "kv_cache_type": kv_cache_type, "threads": threads,
              "n_layers": config.n_layers, "generate_rows": generate_rows}
    with DumpWriter(output_dir, producer="ggml", model=model, inputs={"prompt": prompt},
                    fields=fields, versions=("ggml_python", "tokenizers"),
                    weights=weights_file) as writer:
        runtime = open_runtime(writer, backend, device, threads)
        if runtime is None:
            return
        with runtime:
            _dump(writer, runtime, model, config, request, weight_type, kv_cache_type,
                  generate_rows, weights_file)


def _dump(writer: DumpWriter, runtime: Runtime, model: Path, config, request,
          weight_type: str, kv_cache_type: str, generate_rows: int,
          weights_file: Path | None) -> None:
    with writer.timed("prompt"):
        encoded = text_processor.encode(model, config, request)
    writer.add_json("prompt", encoded.document())
    n_rows = len(encoded.rows)
    if n_rows < 3:
        raise AudioparityError(f"prompt: {n_rows} rows; need at least 3")
    with writer.timed("load"):
        loaded = weights.upload_weights(runtime, model, config, weight_type, weights_file)
        nonzero, storage, stored = loaded.nonzero_pad_rows, loaded.storage, loaded.stored
    writer.note("codebook pad rows: " + (
        f"all {config.n_vq} zero (checked)" if not nonzero
        else f"NOT zero in {', '.join(nonzero)} (pad codes contribute to the embedding)"))
    writer.note("storage: " + ", ".join(f"{count} x {kind}" for kind, count in
                                       sorted(Counter(storage.values()).items()))
                + f" (checkpoint dtypes: {', '.join(sorted(set(stored.values())))})")
    net = Backbone(runtime, loaded.weights, config, kv_cache_type=kv_cache_type,
                   max_context=n_rows + generate_rows)
    with writer.timed("prefill"):
        full = net.prefill(encoded.rows)
    write_prefill(writer, full)

    def step(row: list[int]):
        result = net.step(row)
        return result.text_logits, result.audio_logits

    document = write_generation(writer, config, encoded.rows, full, step, generate_rows)
    with writer.timed("step"):
        net.prefill(encoded.rows[:-1])
        last = net.step(encoded.rows[-1])
    writer.add_tensor("step_last_hidden", last.hidden[-1], "[H]")
    log.info("moss ggml %s: %s weights, %d prompt rows, %d generated", writer.output_dir,
             weight_type, n_rows, len(document["rows"]))
