"""The training of the espeak-ng Parakeet-TDT (src/audioparity/models/parakeet_tdt/training.py):
its TDT loss against a brute-force sum over every path, its data split, and a few steps of the
real training on a tiny data set, whose loss must fall (CI never trains the committed model)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from audioparity.models.parakeet_tdt.training import TrainingRun, tdt_loss, train
from audioparity.models.parakeet_tdt.training_data import VOCABULARY, sentences


def _brute_force(labels, durs, targets, frames, count, durations, sigma):
    """-log P of one utterance: every token-and-duration path enumerated, each ending with a
    blank that lands exactly on frame ``frames`` after emitting the ``count`` targets."""
    lp = torch.log_softmax(labels, -1) - sigma
    dp = torch.log_softmax(durs, -1)
    blank = labels.shape[-1] - 1
    paths = []

    def walk(t, u, score):
        for n, d in enumerate(durations):
            if d >= 1 and t + d == frames and u == count:
                paths.append(score + lp[t, u, blank] + dp[t, u, n])
            elif d >= 1 and t + d < frames:
                walk(t + d, u, score + lp[t, u, blank] + dp[t, u, n])
            if u < count and t + d < frames:
                walk(t + d, u + 1, score + lp[t, u, targets[u]] + dp[t, u, n])

    walk(0, 0, torch.zeros((), dtype=labels.dtype))
    return -torch.logsumexp(torch.stack(paths), 0)


@pytest.mark.parametrize("durations", [(0, 1, 2), (0, 1, 2, 3, 4)])
def test_tdt_loss_is_the_sum_over_every_path(durations):
    generator = torch.Generator().manual_seed(0)
    batch, frames_max, tokens_max, vocab = 3, 5, 3, 4
    labels = torch.randn(batch, frames_max, tokens_max + 1, vocab + 1, generator=generator,
                         dtype=torch.float64)
    durs = torch.randn(batch, frames_max, tokens_max + 1, len(durations), generator=generator,
                       dtype=torch.float64)
    targets = torch.randint(0, vocab, (batch, tokens_max), generator=generator)
    frames = torch.tensor([5, 4, 3])
    counts = torch.tensor([3, 1, 2])  # padded frames and targets in rows 1 and 2
    loss = tdt_loss(torch.cat([labels, durs], dim=-1), targets, frames, counts, durations,
                    sigma=0.05)
    expected = [_brute_force(labels[b], durs[b], targets[b], int(frames[b]), int(counts[b]),
                             durations, 0.05) for b in range(batch)]
    torch.testing.assert_close(loss, torch.stack(expected), rtol=1e-10, atol=1e-10)


def test_heldout_sentences_are_unseen_and_in_the_vocabulary():
    train_texts = sentences(2000, 0)
    heldout = sentences(200, 1, exclude=frozenset(train_texts))
    assert not set(heldout) & set(train_texts)
    assert {w for text in train_texts + heldout for w in text.split()} <= set(VOCABULARY)
    assert sentences(50, 0) == train_texts[:50]  # seeded


def test_training_runs_and_the_loss_falls(tmp_path):
    if shutil.which("espeak-ng") is None:
        if os.environ.get("AUDIOPARITY_REQUIRE_ESPEAK"):
            pytest.fail("AUDIOPARITY_REQUIRE_ESPEAK is set but espeak-ng is not installed")
        pytest.skip("no espeak-ng (setup/apt.sh espeak-ng)")
    # 6 sentences make one batch, so every step sees the same audio: the loss must fall
    run = TrainingRun(train_count=6, heldout_count=2, steps=12, lr=1.0e-3, warmup=2,
                      checkpoint_every=12, batch_seconds=60.0)
    record = train(tmp_path / "model", seed=0, run=run)
    losses = record["losses"]
    assert len(losses) == 12
    assert max(losses[-3:]) < 0.85 * losses[0], losses  # a broken gradient stays flat
    written = json.loads((tmp_path / "model" / "training.json").read_text())
    assert written["checkpoints"][0]["steps"] == 12
    assert (tmp_path / "model" / "model.nemo").stat().st_size > 4_000_000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # the tokenizer is gone
