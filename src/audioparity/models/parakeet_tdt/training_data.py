"""Speech to train the Parakeet-TDT of ``resources/models/parakeet-tdt-espeak`` on: sentences
drawn from a fixed vocabulary by a small grammar, spoken by espeak-ng in several voices and
speeds, at 16 kHz.

The split: training sentences, and held-out sentences the training never saw (drawn from
another seed, any that is also a training sentence dropped); the held-out sentences are spoken
in the training voices (:data:`TRAIN_VOICES`, speeds in :data:`TRAIN_SPEEDS`) and in
voice/speed combinations the training never heard (:data:`HELDOUT_VOICES`).
"""

from __future__ import annotations

import io
import random
import shutil
import subprocess
from dataclasses import dataclass

import numpy as np

from audioparity.contract.errors import AudioparityError

#: Sample rate of the utterances (the model's).
SAMPLE_RATE = 16000

#: The grammar's word classes; every word a sentence can hold is in one of them.
NAMES = ("anna", "peter", "maria", "john", "lucy", "david", "emma", "oscar")
DETERMINERS = ("the", "a", "my", "your", "his", "her", "our", "their", "this", "that", "every")
ADJECTIVES = ("red", "blue", "green", "yellow", "black", "white", "small", "big", "old", "young",
              "happy", "quiet", "loud", "bright", "dark", "warm", "cold", "fast", "slow", "tall",
              "clean", "heavy", "soft", "sharp", "strange", "gentle", "brave", "busy")
NOUNS = ("dog", "cat", "bird", "horse", "fish", "man", "woman", "child", "teacher", "doctor",
         "farmer", "driver", "king", "queen", "boat", "car", "train", "house", "garden", "river",
         "mountain", "city", "village", "forest", "road", "bridge", "window", "door", "table",
         "chair", "book", "letter", "song", "story", "apple", "bread", "water", "coffee", "music",
         "picture", "phone", "computer", "clock", "key", "box", "bag", "ball", "flower", "tree",
         "stone")
VERBS = ("saw", "found", "took", "made", "opened", "closed", "painted", "carried", "watched",
         "heard", "followed", "bought", "sold", "moved", "washed", "fixed", "dropped", "lifted",
         "pushed", "pulled", "cleaned", "wanted", "liked", "needed", "showed", "brought", "left",
         "kept", "held", "built")
PREPOSITIONS = ("in", "on", "near", "under", "behind", "over", "beside", "from", "to", "with",
                "across")
ADVERBS = ("slowly", "quickly", "again", "today", "yesterday", "later", "quietly", "early")

#: Every word of the grammar.
VOCABULARY = tuple(sorted({*NAMES, *DETERMINERS, *ADJECTIVES, *NOUNS, *VERBS, *PREPOSITIONS,
                           *ADVERBS}))

#: espeak-ng voices (language + variant) the training speaks in.
TRAIN_VOICES = ("en-us", "en-us+f2", "en+m3", "en-gb-x-rp+f4", "en-us+m7", "en-029+f1", "en+m1",
                "en-us+f3", "en-gb-x-gbclan+m2", "en-us-nyc+f5")
#: Speaking rates of the training, words per minute (espeak-ng ``-s``), drawn uniformly.
TRAIN_SPEEDS = (130, 190)
#: Voice/speed combinations no training utterance has: a language and variants it never heard.
HELDOUT_VOICES = (("en-gb-scotland+m4", 150), ("en-gb-x-gbcwmd+f1", 175))


@dataclass(frozen=True)
class Utterance:
    """One spoken sentence: its ``text`` (lower-case words, single spaces), the espeak-ng
    ``voice`` and ``speed`` (words per minute) that spoke it, and its ``audio`` (float32 mono at
    :data:`SAMPLE_RATE`, in [-1, 1])."""

    text: str
    voice: str
    speed: int
    audio: np.ndarray


def _noun_phrase(rng: random.Random) -> list[str]:
    """A name, or a determiner, an optional adjective and a noun."""
    if rng.random() < 0.15:
        return [rng.choice(NAMES)]
    adjective = [rng.choice(ADJECTIVES)] if rng.random() < 0.6 else []
    return [rng.choice(DETERMINERS), *adjective, rng.choice(NOUNS)]


def sentence(rng: random.Random) -> str:
    """One sentence of the grammar: subject, verb, object, an optional prepositional phrase and
    an optional adverb (4 to 13 words of :data:`VOCABULARY`)."""
    words = [*_noun_phrase(rng), rng.choice(VERBS), *_noun_phrase(rng)]
    if rng.random() < 0.6:
        words += [rng.choice(PREPOSITIONS), *_noun_phrase(rng)]
    if rng.random() < 0.3:
        words.append(rng.choice(ADVERBS))
    return " ".join(words)


def sentences(count: int, seed: int, exclude: frozenset[str] = frozenset()) -> list[str]:
    """``count`` distinct sentences drawn from ``random.Random(seed)``, none in ``exclude``."""
    rng = random.Random(seed)
    drawn: dict[str, None] = {}
    while len(drawn) < count:
        text = sentence(rng)
        if text not in exclude:
            drawn[text] = None
    return list(drawn)


def speak(text: str, voice: str, speed: int) -> np.ndarray:
    """``text`` spoken by espeak-ng in ``voice`` at ``speed`` words per minute, resampled to
    :data:`SAMPLE_RATE` (soxr): float32 mono in [-1, 1].

    Raises:
        AudioparityError: espeak-ng is not installed (``setup/apt.sh espeak-ng``) or fails.
    """
    import soundfile
    import soxr

    if shutil.which("espeak-ng") is None:
        raise AudioparityError("espeak-ng not found on PATH; install it with "
                               "setup/apt.sh espeak-ng")
    result = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "--stdout", text],
                            capture_output=True, check=False)
    if result.returncode != 0 or not result.stdout:
        raise AudioparityError(f"espeak-ng -v {voice} -s {speed} failed on {text!r}: "
                               f"{result.stderr.decode(errors='replace').strip()}")
    audio, rate = soundfile.read(io.BytesIO(result.stdout), dtype="float32")
    return soxr.resample(audio, rate, SAMPLE_RATE).astype(np.float32)


def utterances(texts: list[str], voices: tuple[str, ...], speeds: tuple[int, int],
               seed: int) -> list[Utterance]:
    """Each of ``texts`` spoken once, in a voice drawn from ``voices`` and a speed drawn
    uniformly from the inclusive range ``speeds`` (``random.Random(seed)``)."""
    rng = random.Random(seed)
    spoken = []
    for text in texts:
        voice, speed = rng.choice(voices), rng.randint(*speeds)
        spoken.append(Utterance(text, voice, speed, speak(text, voice, speed)))
    return spoken


@dataclass(frozen=True)
class Split:
    """The training utterances and the two held-out sets: held-out sentences in the training
    voices and speeds (``heldout``), and the same sentences in :data:`HELDOUT_VOICES`
    (``heldout_voices``)."""

    train: list[Utterance]
    heldout: list[Utterance]
    heldout_voices: list[Utterance]


def split(train_count: int, heldout_count: int, seed: int) -> Split:
    """The data of one training run, all drawn from ``seed``: ``train_count`` training
    sentences, ``heldout_count`` held-out ones (none of them a training sentence), spoken as
    :class:`Split` says."""
    train_texts = sentences(train_count, seed)
    heldout_texts = sentences(heldout_count, seed + 1, exclude=frozenset(train_texts))
    heldout_voices = [Utterance(text, voice, speed, speak(text, voice, speed))
                      for i, text in enumerate(heldout_texts)
                      for voice, speed in [HELDOUT_VOICES[i % len(HELDOUT_VOICES)]]]
    return Split(train=utterances(train_texts, TRAIN_VOICES, TRAIN_SPEEDS, seed),
                 heldout=utterances(heldout_texts, TRAIN_VOICES, TRAIN_SPEEDS, seed + 1),
                 heldout_voices=heldout_voices)
