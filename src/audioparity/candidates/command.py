"""A dump tool of your own with the command line and the dump contract of ``audioparity ggml``
(docs/candidates.md): the candidate's ``command`` is a template of its command line."""

from __future__ import annotations

import shlex

from audioparity.candidates.adapter import EVERY_FAMILY, Adapter, Command, ToolCall, ggml_flags
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import Option
from audioparity.contract.vocabulary import BACKENDS, WEIGHT_TYPES

#: The fields a command template may use.
FIELDS = ("model", "case", "reference", "output", "weight_type", "backend", "threads", "options")


class CommandTool(Adapter):
    name = "command"
    families = EVERY_FAMILY
    title = "a dump tool with the command line of `audioparity ggml`"
    output = "dump"
    weight_types = WEIGHT_TYPES
    backends = BACKENDS
    reads_reference = True
    options = (Option("command", "", "the command template; fields " + ", ".join(
        f"{{{name}}}" for name in FIELDS)),)

    def run(self, call: ToolCall) -> list[Command]:
        """The template filled in (each field shell-quoted; ``{options}`` the family's ggml
        options as our flags), split into argv; ``output`` is the dump directory to write.

        Raises:
            AudioparityError: no template, or one naming an unknown field.
        """
        template = call.options["command"]
        if not template.strip():
            raise AudioparityError("candidate of adapter 'command': option 'command' is empty; "
                                   "expected a command template")
        fields = {name: getattr(call, name) for name in FIELDS if name != "options"}
        try:
            line = template.format(
                **{key: shlex.quote(str(value)) for key, value in fields.items()},
                options=shlex.join(ggml_flags(call.spec, call.family_options)))
        except (KeyError, IndexError, ValueError) as err:
            raise AudioparityError(f"command template {template!r}: {err!r}; fields: "
                                   f"{', '.join(FIELDS)}") from None
        return [(shlex.split(line), {})]
