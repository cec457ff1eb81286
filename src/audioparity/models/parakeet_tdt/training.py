"""Train a small Parakeet-TDT on espeak-ng speech (:mod:`.training_data`), on the CPU, seeded:
the model of ``resources/models/parakeet-tdt-espeak``.

The model is NeMo's ``EncDecRNNTBPEModel`` with parakeet-tdt's architecture (the fixture's
config, :func:`~.fixture.fixture_config`, at the sizes of :data:`SIZES`): the training loop is
ours because NeMo's TDT loss (``TDTLossNumba``) runs on CUDA only; :func:`tdt_loss` is the TDT
loss of Xu et al. 2023 (https://arxiv.org/abs/2304.06795) in PyTorch.
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from audioparity.dumping.artifacts import built_directory
from audioparity.models.parakeet_tdt.fixture import (
    DURATIONS,
    fixture_config,
    save_model,
    train_tokenizer,
)
from audioparity.models.parakeet_tdt.spec import SPEC
from audioparity.models.parakeet_tdt.training_data import SAMPLE_RATE, Utterance, split

log = logging.getLogger("audioparity")

#: The sizes of the trained model: ``d_model`` a multiple of 256 (block-256 quantization
#: applies to the encoder's matrices), a vocabulary of 1024 pieces as parakeet-tdt-0.6b-v2's,
#: the joint as wide as the prediction net (whisper.cpp's loader wants it), at most 4M float32
#: parameters (16 MB).
SIZES = {"d_model": 256, "n_layers": 2, "n_heads": 4, "subsampling_conv_channels": 32,
         "pred_hidden": 128, "joint_hidden": 128, "vocab_size": 1024}
#: TDT logit under-normalization (the loss's ``sigma``), parakeet-tdt's.
SIGMA = 0.02
#: Log-probability of an impossible lattice state (finite, so that no gradient is NaN).
IMPOSSIBLE = -1.0e4


def model_config(tokenizer_dir: Path) -> dict:
    """The NeMo config of the trained model: :func:`~.fixture.fixture_config` (parakeet-tdt's
    structure) at :data:`SIZES`, with SpecAugment (2 frequency masks of up to 15 mels, 2 time
    masks of up to 5 % of the frames) that only training applies, and a ``validation_ds``
    without data, which NeMo's ``transcribe()`` reads its dataloader settings from."""
    cfg = fixture_config(tokenizer_dir, joint_hidden=SIZES["joint_hidden"])
    cfg["model_defaults"].update(enc_hidden=SIZES["d_model"], pred_hidden=SIZES["pred_hidden"])
    cfg["encoder"].update(d_model=SIZES["d_model"], n_layers=SIZES["n_layers"],
                          n_heads=SIZES["n_heads"],
                          subsampling_conv_channels=SIZES["subsampling_conv_channels"])
    cfg["decoder"]["prednet"]["pred_hidden"] = SIZES["pred_hidden"]
    cfg["spec_augment"] = {
        "_target_": "nemo.collections.asr.modules.SpectrogramAugmentation",
        "freq_masks": 2, "time_masks": 2, "freq_width": 15, "time_width": 0.05,
    }
    cfg["validation_ds"] = {"manifest_filepath": None, "sample_rate": 16000, "batch_size": 16,
                            "shuffle": False, "use_start_end_token": False}
    return cfg


def tdt_loss(logits, targets, frames, target_lengths, durations=DURATIONS,
             sigma: float = SIGMA):
    """The TDT loss, ``-log P(targets | audio)`` per utterance, summed over the lattice of
    token-and-duration paths (Xu et al. 2023, eq. 7): NeMo's ``TDTLossNumba(V, durations,
    reduction="none", sigma=sigma)(logits, targets, frames, target_lengths)`` (``acts``,
    ``labels``, ``act_lens``, ``label_lens``; CUDA only there).

    A path at frame t with u tokens emitted either emits the blank with a duration d >= 1
    (to frame t + d) or the next target token with a duration d >= 0 (to frame t + d, u + 1);
    a complete path ends with a blank landing exactly on frame T. Tokens score
    ``log_softmax(label_logits) - sigma`` (logit under-normalization), durations
    ``log_softmax(duration_logits)``.

    Args:
        logits: ``[B, T, U + 1, V + 1 + len(durations)]``, the joint's output: the vocabulary
            and the blank (class V), then the durations' logits (NeMo's TDT joint layout).
        targets: ``[B, U]`` int64 token ids (padding ignored).
        frames: ``[B]`` encoder frames T_b of each utterance.
        target_lengths: ``[B]`` tokens U_b of each utterance.
        durations: the durations, in frames, ``durations[0] == 0``.

    Returns:
        ``[B]`` float losses (nats per utterance).
    """
    import torch

    if durations[0] != 0 or any(d <= 0 for d in durations[1:]):
        raise ValueError(f"durations must be 0 followed by positive frames, got {durations}")
    label_logits = logits[..., :-len(durations)]
    duration_logits = logits[..., -len(durations):]
    batch, frames_max, positions, classes = label_logits.shape
    blank = classes - 1
    labels = torch.log_softmax(label_logits, dim=-1) - sigma
    durs = torch.log_softmax(duration_logits, dim=-1)
    blank_lp = labels[..., blank]  # [B, T, U + 1]
    index = targets[:, None, :positions - 1, None].expand(batch, frames_max, positions - 1, 1)
    emit_lp = labels[:, :, :positions - 1].gather(-1, index).squeeze(-1)  # [B, T, U]
    impossible = label_logits.new_full((batch, 1), IMPOSSIBLE)
    columns = []  # alpha[:, t, :] for each frame t, [B, U + 1]
    for t in range(frames_max):
        arrivals = [label_logits.new_full((batch, positions), IMPOSSIBLE if t else 0.0)
                    .index_fill(1, torch.arange(1, positions), IMPOSSIBLE)]
        for n, d in enumerate(durations[1:], start=1):
            if t - d < 0:
                continue
            alpha = columns[t - d]
            arrivals.append(alpha + blank_lp[:, t - d] + durs[:, t - d, :, n])
            emitted = alpha[:, :-1] + emit_lp[:, t - d] + durs[:, t - d, :-1, n]
            arrivals.append(torch.cat([impossible, emitted], dim=1))
        arrived = torch.logsumexp(torch.stack(arrivals), dim=0)
        # duration-0 emissions within the frame: alpha(t, u) = logaddexp(arrived(t, u),
        # alpha(t, u - 1) + w(t, u - 1)), a prefix log-sum-exp of arrived - W with W the
        # running sum of w
        w = emit_lp[:, t] + durs[:, t, :-1, 0]
        run = torch.cat([w.new_zeros(batch, 1), torch.cumsum(w, dim=1)], dim=1)
        columns.append(run + torch.logcumsumexp(arrived - run, dim=1))
    alphas = torch.stack(columns, dim=1)  # [B, T, U + 1]
    rows = torch.arange(batch)
    finals = []
    for n, d in enumerate(durations[1:], start=1):
        t = frames - d
        ok = t >= 0
        t = t.clamp(min=0)
        final = (alphas[rows, t, target_lengths] + blank_lp[rows, t, target_lengths]
                 + durs[rows, t, target_lengths, n])
        finals.append(torch.where(ok, final, torch.full_like(final, IMPOSSIBLE)))
    return -torch.logsumexp(torch.stack(finals), dim=0)


@dataclass(frozen=True)
class TrainingRun:
    """What one run trains on and for how long: utterance counts, at most ``steps`` optimizer
    steps of batches of at most ``batch_seconds`` of audio, and at most ``minutes`` of training
    (0: no limit), peak learning rate ``lr`` (AdamW, linear warm-up over ``warmup`` steps, then
    cosine decay to 1 % of it over the steps or the minutes, whichever runs out first), a
    checkpoint and held-out WER every ``checkpoint_every`` steps, and the torch ``threads``.

    With ``minutes`` the schedule follows the clock, so the steps a run reaches depend on the
    machine's speed and load (``training.json`` records them); without, a run is a function of
    its seed."""

    train_count: int = 10000
    heldout_count: int = 200
    steps: int = 4000
    minutes: float = 0.0
    batch_seconds: float = 48.0
    lr: float = 1.5e-3
    warmup: int = 300
    checkpoint_every: int = 250
    threads: int = 2


def _batches(utterances: list[Utterance], batch_seconds: float,
             rng: random.Random) -> list[list[Utterance]]:
    """The utterances sorted by length and cut into batches of at most ``batch_seconds`` of
    padded audio, in a shuffled order."""
    ordered = sorted(utterances, key=lambda u: len(u.audio))
    batches, current = [], []
    for utterance in ordered:
        if current and (len(current) + 1) * len(utterance.audio) > batch_seconds * SAMPLE_RATE:
            batches.append(current)
            current = []
        current.append(utterance)
    batches.append(current)
    rng.shuffle(batches)
    return batches


def _audio_batch(utterances: list[Utterance]):
    """``([B, N] float32 audio, zero-padded; [B] lengths in samples)``."""
    import torch

    lengths = torch.tensor([len(u.audio) for u in utterances])
    audio = torch.zeros(len(utterances), int(lengths.max()))
    for row, utterance in enumerate(utterances):
        audio[row, :len(utterance.audio)] = torch.from_numpy(utterance.audio)
    return audio, lengths


def batch_loss(model, utterances: list[Utterance]):
    """Mean TDT loss per target token of ``utterances`` through ``model``
    (``EncDecRNNTBPEModel``; SpecAugment and dropout apply when it is in training mode)."""
    import torch

    audio, lengths = _audio_batch(utterances)
    ids = [model.tokenizer.text_to_ids(u.text) for u in utterances]
    target_lengths = torch.tensor([len(i) for i in ids])
    targets = torch.zeros(len(ids), int(target_lengths.max()), dtype=torch.long)
    for row, tokens in enumerate(ids):
        targets[row, :len(tokens)] = torch.tensor(tokens)
    encoded, frames = model.forward(input_signal=audio, input_signal_length=lengths)
    prediction, _, _ = model.decoder(targets=targets, target_length=target_lengths)
    logits = model.joint(encoder_outputs=encoded, decoder_outputs=prediction)
    losses = tdt_loss(logits, targets, frames, target_lengths)
    return losses.sum() / target_lengths.sum()


def transcribe(model, utterances: list[Utterance], batch_seconds: float = 60.0) -> list[str]:
    """Greedy TDT transcripts of ``utterances`` by ``model`` in eval mode (NeMo's
    ``rnnt_decoder_predictions_tensor``, the model's own decoding config)."""
    import torch

    model.eval()
    texts = {}
    with torch.no_grad():
        for batch in _batches(utterances, batch_seconds, random.Random(0)):
            audio, lengths = _audio_batch(batch)
            encoded, frames = model.forward(input_signal=audio, input_signal_length=lengths)
            hypotheses = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=frames)
            for utterance, hypothesis in zip(batch, hypotheses, strict=True):
                texts[id(utterance)] = hypothesis.text
    return [texts[id(u)] for u in utterances]


def word_error_rate(model, utterances: list[Utterance]) -> float:
    """WER (jiwer) of :func:`transcribe` against the utterances' texts."""
    import jiwer

    return jiwer.wer([u.text for u in utterances], transcribe(model, utterances))


def _progress(step: int, seconds: float, run: TrainingRun) -> float:
    """How far the run is, 0 to 1: the larger of the steps' and the minutes' fraction."""
    progress = step / run.steps
    if run.minutes:
        progress = max(progress, seconds / (60 * run.minutes))
    return progress


def _learning_rate(step: int, progress: float, run: TrainingRun) -> float:
    """Linear warm-up to ``run.lr`` over ``run.warmup`` steps, then cosine decay to 1 % of it
    at ``progress`` 1 (:func:`_progress`)."""
    if step < run.warmup:
        return run.lr * (step + 1) / run.warmup
    return run.lr * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(output: Path, seed: int = 0, run: TrainingRun = TrainingRun()) -> dict:
    """Train the model of :func:`model_config` on :func:`~.training_data.split` and write
    ``output/model.nemo`` (weights float32) and ``output/training.json`` (the run, the loss
    curve, the held-out WERs). Every ``run.checkpoint_every`` steps the directory is rewritten
    whole (:func:`~audioparity.dumping.artifacts.built_directory`), so a run stopped early leaves
    its last checkpoint.

    Returns:
        The ``training.json`` record.
    """
    import nemo.collections.asr.models as nemo_models
    import torch
    from omegaconf import OmegaConf

    torch.set_num_threads(run.threads)
    start = time.perf_counter()
    data = split(run.train_count, run.heldout_count, seed)
    seconds = sum(len(u.audio) for u in data.train) / SAMPLE_RATE
    log.info("train parakeet-tdt: %d training utterances (%.0f s of audio), %d held out, "
             "spoken in %.0f s", len(data.train), seconds, len(data.heldout),
             time.perf_counter() - start)
    output = Path(output)
    tokenizer_dir = train_tokenizer(output.parent / f".{output.name}.tokenizer",
                                    SIZES["vocab_size"], [u.text for u in data.train])
    torch.manual_seed(seed)
    model = nemo_models.EncDecRNNTBPEModel(cfg=OmegaConf.create(model_config(tokenizer_dir)))
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.lr, betas=(0.9, 0.98),
                                  weight_decay=1e-3)
    rng = random.Random(seed)
    record = {"seed": seed, "run": run.__dict__, "sizes": SIZES, "parameters": params,
              "train_seconds": seconds, "losses": [], "checkpoints": []}
    batches: list = []
    step_start = time.perf_counter()
    step = 0
    while (progress := _progress(step, time.perf_counter() - step_start, run)) < 1:
        if not batches:
            batches = _batches(data.train, run.batch_seconds, rng)
        model.train()
        lr = _learning_rate(step, progress, run)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = batch_loss(model, batches.pop())
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        record["losses"].append(round(float(loss), 4))
        step += 1
        if step % 25 == 0:
            log.info("step %d loss %.3f lr %.2e (%.2f s/step)", step, float(loss), lr,
                     (time.perf_counter() - step_start) / step)
        if step % run.checkpoint_every == 0:
            _checkpoint(model, output, record, step, data)
    if step % run.checkpoint_every:
        _checkpoint(model, output, record, step, data)
    shutil.rmtree(tokenizer_dir)
    return record


def _checkpoint(model, output: Path, record: dict, steps: int, data) -> None:
    """Measure the held-out WERs, then write ``output`` whole: ``model.nemo`` (eval mode) and
    ``training.json``."""
    wers = {"steps": steps, "heldout_wer": word_error_rate(model, data.heldout),
            "heldout_voices_wer": word_error_rate(model, data.heldout_voices)}
    record["checkpoints"].append(wers)
    log.info("checkpoint at step %d: held-out WER %.3f, held-out voices WER %.3f", steps,
             wers["heldout_wer"], wers["heldout_voices_wer"])
    with built_directory(output) as work:
        save_model(model, work / SPEC.fixture_model)
        (work / "training.json").write_text(json.dumps(record, indent=1) + "\n")
