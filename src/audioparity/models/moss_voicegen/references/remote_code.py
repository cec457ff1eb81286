"""The PyTorch reference dump of a MOSS-VoiceGenerator checkpoint (producer ``torch``).

Model: a checkpoint whose ``config.json`` has ``auto_map`` is loaded with transformers'
``AutoModel.from_pretrained(trust_remote_code=True)`` (the real checkpoint, unchanged);
otherwise the built-in ``MossTTSDelayModel`` of :mod:`.remote_code` (transformers' ``Qwen3Model``
plus the codebook embeddings and heads). Always float32 (whatever the storage dtype), eager
attention, CPU, batch size 1. The forward runs through the model's own modules (:func:`forward`).

Prompt: the checkpoint's own processor when it ships one (``AutoProcessor`` in ``auto_map``),
built without the audio tokenizer; else the user block of :mod:`.text_processor` wrapped by the
tokenizer's chat template (transformers ``apply_chat_template``) and encoded by transformers'
tokenizer.

Dump (canonical layouts, batch dropped; float32):

- document ``prompt``: ``{"text": rendered string, "rows": [[text, code_0, ...], ...]}``
  (rows ``[S, 1+n_vq]``);
- ``last_hidden`` ``[H]``: final (normed) hidden state at the last prompt row, full prefill;
- ``probe_hidden`` ``[3, H]``: the same at rows ``[0, 1, S//2]``;
- ``layer_{i}`` ``[S, H]``: output of decoder layer ``i`` at every row (forward hooks; before
  the final norm for the last layer);
- ``step_last_hidden`` ``[H]``: final hidden of row ``S-1`` fed as one cached step after a
  prefill of rows ``0..S-2`` (transformers' KV cache);
- ``text_logits`` ``[vocab_size]``, ``audio_logits`` ``[n_vq, audio_vocab_size+1]`` (pad logit
  ``-inf``): the heads at the last row of the full prefill;
- document ``generation`` and tensor ``generation_margins`` ``[rows, 1+n_vq]``: greedy rows
  after the full prefill, through the KV cache, and their argmax margins
  (:func:`.delay_pattern.greedy_generate`; schemas in :mod:`.stages`);
- ``generation_text_logits`` ``[rows, vocab_size]``, ``generation_audio_logits``
  ``[rows, n_vq, audio_vocab_size+1]``: the heads that decided each generated row, as the
  greedy loop computed them (its own path, which the ggml dump is teacher-forced along;
  :func:`.stages.path_outputs`).

Manifest fields ``modeling`` (:attr:`.MossTTSDelayConfig.modeling`) and ``request``: the
prompt file's ``text``, ``instruction``, ``language`` (null when absent), what the seed tool's
``--prompt`` takes (:mod:`.seed`). Importing this module imports neither torch nor ggml.

Replay (:func:`replayed`), the reference side of a MOSS-VoiceGenerator candidate's: torch runs
each Qwen3 decoder layer on the candidate's own input to it, so a port that cannot be fed the
reference's activations layer by layer (llama.cpp, openmoss) is still localised layer by layer
(docs/candidates.md, "Replay").

In one prefill of the reference's prompt rows, forward pre-hooks substitute the candidate's
``layer_{i-1}`` ``[S, H]`` for the input of decoder layer ``i``, and its ``input_embeddings``
for layer 0's. What layer ``i`` computes on it is ``layer_{i}_replayed`` ``[S, H]``; the compare
measures the candidate's ``layer_{i}`` against it: the error of that layer alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import (
    Case,
    Fields,
    Note,
    Outputs,
    Phase,
    ReferenceLibrary,
    Skipped,
)
from audioparity.contract.taps import Taps
from audioparity.dumping.artifacts import Dump
from audioparity.models.moss_voicegen import text_processor
from audioparity.models.moss_voicegen.config import MossTTSDelayConfig
from audioparity.models.moss_voicegen.spec import Names
from audioparity.models.moss_voicegen.stages import (
    Forward,
    generation_outputs,
    path_outputs,
    prefill_outputs,
)

log = logging.getLogger("audioparity")

#: Files that may declare the checkpoint's processor class under ``auto_map.AutoProcessor``.
PROCESSOR_DECLARATIONS = ("processor_config.json", "config.json", "tokenizer_config.json")


def load_model(model_dir: Path, config: MossTTSDelayConfig):
    """The checkpoint as a float32 ``MossTTSDelayModel`` in eval mode, eager attention.

    Raises:
        AudioparityError: transformers cannot load it, or a weight is missing or unexpected.
    """
    import torch

    if config.auto_map:
        from transformers import AutoModel as loader

        kwargs = {"trust_remote_code": True}
    else:
        from audioparity.models.moss_voicegen.remote_code.modeling_moss_tts import (
            MossTTSDelayModel as loader,
        )

        kwargs = {}
    try:
        net, info = loader.from_pretrained(
            str(model_dir), dtype=torch.float32, attn_implementation="eager",
            output_loading_info=True, **kwargs,
        )
    except (OSError, ValueError, KeyError) as err:
        raise AudioparityError(f"{model_dir}: transformers cannot load the model ({err})") from err
    problems = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys") and v}
    if problems:
        raise AudioparityError(f"{model_dir}: weights do not match the model: {problems}")
    net.language_model.config._attn_implementation = "eager"
    return net.eval()


def _processor_class(model_dir: Path):
    """The checkpoint's processor class (``auto_map.AutoProcessor``), or None.

    Raises:
        AudioparityError: the processor's module needs a package that is not installed.
    """
    for name in PROCESSOR_DECLARATIONS:
        path = model_dir / name
        if not path.is_file():
            continue
        reference = (json.loads(path.read_text()).get("auto_map") or {}).get("AutoProcessor")
        if reference:
            from transformers.dynamic_module_utils import get_class_from_dynamic_module

            try:
                return get_class_from_dynamic_module(reference, str(model_dir))
            except ImportError as err:  # upstream's processor imports torchaudio
                raise AudioparityError(f"{path}: processor {reference} cannot be imported "
                                       f"({err})") from err
    return None


def reference_prompt(model_dir: Path, config: MossTTSDelayConfig,
                     prompt: text_processor.Prompt) -> text_processor.EncodedPrompt:
    """The prompt as the reference processor renders and encodes it (see module docstring)."""
    from transformers import AutoConfig, AutoTokenizer

    remote = bool(config.auto_map)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=remote)
    processor_class = _processor_class(model_dir)
    if processor_class is not None:
        processor = processor_class(
            tokenizer=tokenizer, audio_tokenizer=None,
            model_config=AutoConfig.from_pretrained(str(model_dir), trust_remote_code=True),
        )
        message = processor.build_user_message(text=prompt.text, instruction=prompt.instruction,
                                               language=prompt.language)
        rows = processor([[message]], mode="generation")["input_ids"][0].numpy()
        content = message["content"]
    else:
        content = text_processor.user_content(prompt)
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                         add_generation_prompt=True, tokenize=False)
    if processor_class is None:
        rows = text_processor.generation_rows(tokenizer.encode(text), config)
    return text_processor.EncodedPrompt(text=text, rows=np.asarray(rows, dtype=np.int64))


def forward(net, rows, cache=None, layer_inputs=None) -> tuple[Forward, object]:
    """``MossTTSDelayModel.forward`` (default ``hidden_out_layers=None``) through the model's own
    modules: ``_compute_input_embeddings``, ``language_model``, ``lm_heads`` with the audio pad
    logit ``-inf``; per-layer outputs from forward hooks on ``language_model.layers``, and, for
    the replay, per-layer inputs substituted by forward pre-hooks
    (:class:`~audioparity.contract.taps.Taps`).

    The modules are driven one by one rather than through ``net.forward`` because upstream's
    forward returns its own ``ModelOutput`` subclass declaring ``past_key_values``, which
    transformers 5.x (whose outputs renamed it ``cache``) rejects at construction.

    Args:
        net: a loaded ``MossTTSDelayModel``.
        rows: ``[1, n, 1+n_vq]`` long tensor.
        cache: the transformers cache of the previous rows, or None.
        layer_inputs: ``{layer: [n, H] float32 array}`` or None: the hidden states each named
            decoder layer runs on instead of its predecessor's output (layer 0: instead of the
            input embeddings); the layers not named run on their predecessor's output.

    Returns:
        The :class:`~.stages.Forward` of the rows, and transformers' cache after them.
    """
    import torch

    layers = net.language_model.layers
    with Taps("decoder") as taps:
        taps.outputs(Names.LAYER, layers)
        for index, given in (layer_inputs or {}).items():
            taps.replace_input(layers[index], torch.from_numpy(given)[None], "hidden_states")
        # The cache is Qwen3Model.forward's 4th parameter (``past_key_values`` until
        # transformers 5.x renamed it ``cache``); passed by position to fit both.
        embeddings = net._compute_input_embeddings(rows)
        out = net.language_model(None, None, None, cache, inputs_embeds=embeddings,
                                 use_cache=True)
    hidden = out.last_hidden_state[0]
    heads = [head(hidden)[-1] for head in net.lm_heads]  # all rows, as upstream (same GEMM)
    audio = torch.stack(heads[1:])
    audio[:, -1] = float("-inf")
    result = Forward(
        embeddings=embeddings[0].numpy(),
        hidden=hidden.numpy(),
        layers=np.stack([taps.once(Names.LAYER.at(i))[0].numpy() for i in range(len(layers))]),
        text_logits=heads[0].numpy(),
        audio_logits=audio.numpy(),
    )
    return result, out.cache if hasattr(out, "cache") else out.past_key_values


def stages(net, case: Case, generate_rows: int, run=forward, modeling: str | None = None,
           note: str | None = None) -> Outputs:
    """The reference's stages of one case (module docstring) with the loaded ``net``, each phase
    timed by the driver.

    Args:
        run: one forward of ``net`` (``run(net, rows [1, n, 1+n_vq], cache=None) -> (Forward,
            cache)``): :func:`forward` through the checkpoint's own modules, or another
            implementation's (:func:`.transformers_reference.forward`).
        modeling: the manifest's ``modeling`` (default the config's); ``note``: the dump's
            note on what computed it (default the checkpoint's code's).

    Raises:
        AudioparityError: a prompt of fewer than 3 rows.
    """
    import torch
    import transformers

    config = case.config
    yield Fields({"modeling": modeling or config.modeling})
    yield Phase(Names.PROMPT)
    encoded = reference_prompt(case.model, config, case.data)
    yield Names.PROMPT, encoded.document()
    rows = torch.from_numpy(encoded.rows)[None]
    n_rows = rows.shape[1]
    if n_rows < 3:
        raise AudioparityError(f"{case.path}: {n_rows} prompt rows; need at least 3")
    with torch.inference_mode():
        yield Phase(Names.INPUT_EMBEDDINGS)
        full, full_cache = run(net, rows)
        yield from prefill_outputs(full)

        yield Phase(Names.STEP_LAST_HIDDEN)
        _, head_cache = run(net, rows[:, :-1])
        last, _ = run(net, rows[:, -1:], head_cache)
        yield Names.STEP_LAST_HIDDEN, last.hidden[-1]

        cache = full_cache

        def step(row: list[int]) -> tuple[np.ndarray, np.ndarray]:
            nonlocal cache
            result, cache = run(net, torch.tensor([[row]], dtype=torch.long), cache)
            return result.text_logits, result.audio_logits

        yield Phase(Names.GENERATION_TEXT_LOGITS)  # its loop computes the path stages
        document, heads = yield from generation_outputs(config, encoded.rows, full, step,
                                                        generate_rows)
        yield from path_outputs(heads)
    yield Note(note or f"transformers {transformers.__version__}, float32, eager attention, "
                       f"{config.modeling} modeling code")
    log.info("moss reference %s: %d prompt rows, %d generated", case.path, n_rows,
             len(document["rows"]))


def layer_inputs(candidate: Dump, n_layers: int, shape: tuple[int, int]
                 ) -> tuple[dict[int, np.ndarray], dict[str, str], list[str]]:
    """The candidate's input to each decoder layer: ``input_embeddings`` for layer 0,
    ``layer_{i-1}`` for layer ``i``, each ``[S, H]`` float32.

    Args:
        candidate: the candidate's dump of the case.
        n_layers: decoder layers of the checkpoint.
        shape: ``(S, H)`` of the reference's prompt.

    Returns:
        ``(inputs, skipped, notes)``: ``{layer: array}``; for each ``layer_{i}_replayed`` that
        cannot be replayed, why (the candidate lacks its input or has it in another shape);
        notes. A candidate without ``input_embeddings`` (one fed the reference's, as llama.cpp
        is) has layer 0 replayed on the reference's own, and a note says so.
    """
    inputs: dict[int, np.ndarray] = {}
    skipped: dict[str, str] = {}
    notes: list[str] = []
    for layer in range(n_layers):
        name = Names.INPUT_EMBEDDINGS if layer == 0 else Names.LAYER.at(layer - 1)
        replayed = Names.LAYER_REPLAYED.at(layer)
        if not candidate.has(name):
            if layer == 0:
                notes.append("layer_0 replayed on the reference's input_embeddings: the "
                             "candidate dump has none")
            else:
                skipped[replayed] = f"the candidate dump has no {name}"
            continue
        array = candidate.tensor(name)
        if array.shape != shape:
            skipped[replayed] = (f"the candidate's {name} is {list(array.shape)}, the "
                                 f"reference's input there is {list(shape)}")
            continue
        inputs[layer] = np.ascontiguousarray(array, dtype=np.float32)
    return inputs, skipped, notes


def replayed(net, case: Case, candidate: Dump) -> Outputs:
    """The reference's decoder layers on a candidate's own inputs (module notes), with the loaded
    ``net``: ``layer_{i}_replayed`` ``[S, H]`` of each layer the candidate gives an input for,
    :class:`~audioparity.contract.family.Skipped` with why for the others (one forward: phase
    ``layer_0_replayed``).

    Args:
        net: the loaded ``MossTTSDelayModel`` (computing as the cell's weight type, for a
            quantized cell's replay).
        case: the case's request, rendered by the reference's own processor.
        candidate: the candidate's dump of the case.
    """
    import torch

    config = case.config
    with torch.inference_mode():
        yield Phase(Names.LAYER_REPLAYED.at(0))
        rows = reference_prompt(case.model, config, case.data).rows
        inputs, skipped, notes = layer_inputs(candidate, config.n_layers,
                                              (len(rows), config.hidden_size))
        full, _ = forward(net, torch.from_numpy(rows)[None], layer_inputs=inputs)
    for layer, array in enumerate(full.layers):
        name = Names.LAYER_REPLAYED.at(layer)
        if name not in skipped:
            yield name, array
    for note in notes:
        yield Note(note)
    for stage, why in skipped.items():
        yield Skipped(stage, why)
    log.info("replay moss-voicegen: %s: %d layers replayed, %d not", candidate.path,
             config.n_layers - len(skipped), len(skipped))


class RemoteCode(ReferenceLibrary):
    """The checkpoint's own ``MossTTSDelayModel`` (:func:`load_model`): its stages
    (:func:`stages`) and its decoder layers on a candidate's inputs (:func:`~..replay.replayed`)."""

    def __init__(self, model: Path, config: MossTTSDelayConfig, options: Mapping[str, Any]
                 ) -> None:
        super().__init__(model, config, options)
        self.net = load_model(model, config)

    @property
    def module(self) -> Any:
        return self.net

    def stages(self, case: Case) -> Outputs:
        return stages(self.net, case, case.options["generate_rows"])

    def replay(self, case: Case, candidate: Any) -> Outputs:
        return replayed(self.net, case, candidate)
