"""``MossTTSDelayProcessor`` for generation prompts without reference audio.

Mirrors OpenMOSS ``processing_moss_tts.py`` (``UserMessage``, ``MossTTSDelayProcessor.__call__``
in ``mode="generation"``): the user message is the ``<user_inst>`` block with every field
``str(value)`` (so ``"None"`` when unused), wrapped by the tokenizer's chat template with the
generation prompt, encoded with ``tokenizer.encode`` in one pass; every audio column is
``audio_pad_code``; then the ``audio_start`` row the generation mode appends. Reference audio
(which needs the audio tokenizer) is not supported here.
"""

import torch

USER_TEMPLATE = """<user_inst>
- Reference(s):
{reference}
- Instruction:
{instruction}
- Tokens:
{tokens}
- Quality:
{quality}
- Sound Event:
{sound_event}
- Ambient Sound:
{ambient_sound}
- Language:
{language}
- Text:
{text}
</user_inst>"""


class MossTTSDelayProcessor:
    """Text side of the upstream processor: messages -> ``input_ids`` ``[B, S, 1+n_vq]``."""

    def __init__(self, tokenizer, audio_tokenizer=None, model_config=None, **kwargs):
        self.tokenizer = tokenizer
        self.audio_tokenizer = audio_tokenizer
        self.model_config = model_config

    @staticmethod
    def build_user_message(text=None, reference=None, instruction=None, tokens=None,
                           quality=None, sound_event=None, ambient_sound=None, language=None):
        """``{"role": "user", "content": str, "audio_codes_list": []}``."""
        if reference is not None:
            raise ValueError("reference audio needs the audio tokenizer; not supported here")
        content = USER_TEMPLATE
        for key, value in (("reference", None), ("instruction", instruction),
                           ("tokens", tokens), ("quality", quality),
                           ("sound_event", sound_event), ("ambient_sound", ambient_sound),
                           ("language", language), ("text", text)):
            content = content.replace("{" + key + "}", str(value))
        return {"role": "user", "content": content, "audio_codes_list": []}

    def __call__(self, conversations, mode="generation", **kwargs):
        if mode != "generation":
            raise ValueError(f"mode {mode!r}: only 'generation' is supported here")
        n_vq = self.model_config.n_vq
        rows = []
        for conversation in conversations:
            if len(conversation) != 1 or conversation[0]["role"] != "user":
                raise ValueError("a generation conversation is one user message")
            content = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": conversation[0]["content"]}],
                add_generation_prompt=True, tokenize=False,
            )
            ids = torch.tensor(self.tokenizer.encode(content), dtype=torch.long)
            audio = torch.full((ids.shape[0], n_vq), self.model_config.audio_pad_code,
                               dtype=torch.long)
            start = torch.full((1, 1 + n_vq), self.model_config.audio_pad_code,
                               dtype=torch.long)
            start[0, 0] = self.tokenizer.encode(self.tokenizer.convert_ids_to_tokens(
                self.model_config.audio_start_token_id))[0]
            rows.append(torch.cat([torch.cat([ids[:, None], audio], dim=1), start]))
        if len({r.shape[0] for r in rows}) != 1:
            raise ValueError("batches of different lengths need padding; pass one conversation")
        input_ids = torch.stack(rows)
        return {"input_ids": input_ids,
                "attention_mask": torch.ones(input_ids.shape[:2], dtype=torch.bool)}
