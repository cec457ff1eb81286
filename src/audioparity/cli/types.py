"""The command line's argparse types: each parses one argument or refuses it with a usage error
naming what was expected (numbers, choices, weight types and recipes, ``<type>=<file>``
pairs)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from audioparity.contract.vocabulary import RECIPE_SEPARATOR


def value(what: str, kind: type = str, choices: tuple = (), minimum: int | None = None,
           null: str | None = None):
    """An argparse type: the text as ``kind``, one of ``choices`` if given, at least
    ``minimum`` if given, or None where it is ``null`` (given: the option is nullable);
    otherwise a usage error naming ``what``."""

    def parse(text: str):
        if null is not None and text == null:
            return None
        try:
            value = kind(text)
        except ValueError:
            expected = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
            raise argparse.ArgumentTypeError(f"{what} {text!r}: expected {expected}") from None
        if choices and value not in choices:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text!r}; valid: {', '.join(map(str, choices))}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{what} {value}: expected at least {minimum}")
        return value

    return parse


def weight_type(choices: tuple[str, ...]):
    """An argparse type: a weight type of ``choices``, or a recipe's ``<type>+<name>`` whose
    type is one of them (the recipe's file is given by ``--recipe <type>+<name>=<file>``)."""
    plain = value("weight type", choices=choices)

    def parse(text: str) -> str:
        base, separator, name = text.partition(RECIPE_SEPARATOR)
        plain(base)
        if separator:
            recipe_name(name)
        return text

    return parse


def recipe_name(text: str) -> str:
    """An argparse type: a recipe's name (letters, digits, ``_`` and ``-``)."""
    if not re.fullmatch(r"[A-Za-z0-9_-]+", text):
        raise argparse.ArgumentTypeError(f"recipe name {text!r}: expected letters, digits, '_' "
                                         "and '-'")
    return text


def recipe_file(text: str) -> str:
    """An argparse type: ``<type>+<name>=FILE``."""
    weight_type, separator, path = text.partition("=")
    if not separator or RECIPE_SEPARATOR not in weight_type or not path:
        raise argparse.ArgumentTypeError(f"--recipe {text!r}: expected <type>+<name>=FILE")
    return text


def storage_file(text: str) -> tuple[str, Path]:
    """An argparse type: ``<weight type>=<storage file>``."""
    weight_type, separator, path = text.partition("=")
    if not separator or not weight_type or not path:
        raise argparse.ArgumentTypeError(f"--storage {text!r}: expected <weight type>=FILE")
    return weight_type, Path(path)
