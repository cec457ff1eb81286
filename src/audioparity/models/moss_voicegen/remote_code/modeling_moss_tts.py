"""``MossTTSDelayModel``: a Qwen3 backbone with per-codebook embeddings and heads.

Mirrors OpenMOSS ``modeling_moss_tts.py`` (``MossTTSDelayModel``), forward only:

- input rows ``input_ids`` ``[B, S, 1+n_vq]``: column 0 text ids, column ``i+1`` codes of
  codebook ``i`` (``audio_pad_code`` = no code);
- embedding = ``language_model.embed_tokens(col 0) + sum_i emb_ext[i](col i+1)``, summed in
  codebook order (``_compute_input_embeddings``);
- ``language_model``: transformers' ``Qwen3Model`` on ``inputs_embeds``;
- heads on the final (normed) hidden state: ``lm_heads[0]`` text ``[B, S, vocab_size]``,
  ``lm_heads[1+i]`` codebook ``i`` ``[B, S, audio_vocab_size+1]`` with the last (pad) logit set to
  ``-inf``.

Weight names: ``language_model.*``, ``emb_ext.{i}.weight`` ``[audio_vocab_size+1, H]``,
``lm_heads.{j}.weight`` (``nn.Linear`` layout ``[out, H]``).
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel, Qwen3Model

from .configuration_moss_tts import MossTTSDelayConfig


@dataclass
class MossTTSDelayOutputWithPast:
    """``logits``: list of ``1 + n_vq`` head outputs ``[B, S, V_j]``; the rest as transformers'.

    A plain dataclass: transformers 5.x renames a ``past_key_values`` argument of a
    ``ModelOutput`` to ``cache``, which a subclass declaring ``past_key_values`` rejects.
    """

    logits: list | None = None
    past_key_values: object | None = None
    hidden_states: tuple | None = None


class MossTTSDelayPreTrainedModel(PreTrainedModel):
    config_class = MossTTSDelayConfig
    base_model_prefix = "model"
    _no_split_modules = ["Qwen3DecoderLayer"]
    _supports_sdpa = True


class MossTTSDelayModel(MossTTSDelayPreTrainedModel):
    """The delay-pattern TTS model: ``language_model``, ``emb_ext``, ``lm_heads``."""

    def __init__(self, config: MossTTSDelayConfig):
        super().__init__(config)
        hidden = config.language_config.hidden_size
        self.language_model = Qwen3Model(config.language_config)
        self.emb_ext = nn.ModuleList(
            nn.Embedding(config.audio_vocab_size + 1, hidden) for _ in range(config.n_vq)
        )
        self.lm_heads = nn.ModuleList(
            [nn.Linear(hidden, config.language_config.vocab_size, bias=False)]
            + [nn.Linear(hidden, config.audio_vocab_size + 1, bias=False)
               for _ in range(config.n_vq)]
        )
        self.post_init()

    def get_input_embeddings(self):
        return self.language_model.get_input_embeddings()

    def _compute_input_embeddings(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """``[B, S, 1+n_vq]`` ids -> ``[B, S, H]``: text embedding plus every codebook's."""
        inputs_embeds = self.get_input_embeddings()(input_ids[..., 0])
        for i, embed_layer in enumerate(self.emb_ext):
            inputs_embeds = inputs_embeds + embed_layer(input_ids[..., i + 1])
        return inputs_embeds

    def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=None, **kwargs) -> MossTTSDelayOutputWithPast:
        if input_ids.dim() != 3 or input_ids.shape[-1] != self.config.n_vq + 1:
            raise ValueError(
                f"input_ids must be [batch, seq, {self.config.n_vq + 1}], "
                f"got {list(input_ids.shape)}"
            )
        # The cache is Qwen3Model.forward's 4th parameter: ``past_key_values`` up to
        # transformers 5.x's rename to ``cache``; passed by position to fit both.
        outputs = self.language_model(
            None, attention_mask, position_ids, past_key_values,
            inputs_embeds=self._compute_input_embeddings(input_ids),
            use_cache=use_cache,
            output_hidden_states=True,
            return_dict=True,
            **kwargs,
        )
        logits = []
        for i, head in enumerate(self.lm_heads):
            head_logits = head(outputs.last_hidden_state)
            if i > 0:
                head_logits[..., -1] = float("-inf")
            logits.append(head_logits)
        return MossTTSDelayOutputWithPast(
            logits=logits,
            past_key_values=outputs.cache if hasattr(outputs, "cache") else outputs.past_key_values,
            hidden_states=outputs.hidden_states,
        )
