"""Loading a causal LM and its tokenizer: a local directory, a hub id, or the built-in offline model.

The built-in model is a tiny Qwen2-architecture network with random weights drawn from a fixed seed and the
real Qwen2 tokenizer shipped in this package. It writes nonsense, but every constrained answer is valid, and it
loads in seconds with no network, so `structgen serve` works out of the box.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

BUILTIN_MODEL = "structgen-builtin"
BUILTIN_DIR = Path(__file__).parent / "builtin_model"
BUILTIN_SEED = 0
BUILTIN_CONTEXT_LENGTH = 4096


class ModelLoadError(RuntimeError):
    """The model or its tokenizer cannot be loaded; the message says why in one line."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object  # transformers PreTrainedTokenizerBase
    name: str  # what --model said
    device: torch.device
    dtype: torch.dtype
    context_length: int
    eos_token_ids: frozenset[int]
    logits_width: int  # the model's output width (>= len(tokenizer) when the vocabulary is padded)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError:  # (torch's message lists every device type it knows, most of which are refused below)
        raise ModelLoadError(f"invalid device {device!r}: use auto, cpu, cuda, cuda:N or mps (where torch "
                             "has it)") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ModelLoadError(f"device {device!r} requested but this machine has {torch.cuda.device_count()} GPU(s)")
    mps = resolved.type == "mps" and torch.backends.mps.is_available()
    if resolved.type not in ("cpu", "cuda") and not mps:  # (`meta`, `mps` off macOS: a traceback at start-up)
        raise ModelLoadError(f"device {device!r} is not supported here: use auto, cpu, cuda, cuda:N or mps (where "
                             "torch has it)")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on CUDA when supported (else fp16), fp32 on CPU."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16, "fp16": torch.float16,
             "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in table:
        raise ModelLoadError(f"invalid dtype {dtype!r}: choose one of auto, {', '.join(sorted(table))}")
    return table[dtype]


def _eos_token_ids(model, tokenizer, logits_width: int) -> frozenset[int]:
    """Every id that ends generation: the generation config's EOS list, the tokenizer's EOS, and the
    chat-turn terminators the chat template writes (e.g. <|im_end|>, <|end|>, <|eot_id|>). In gpt-oss's harmony
    format `<|end|>` ends a message, not the output (a reasoning message ends with it): there it is left out.
    An id past the model's logits is never sampled: left out, with a warning (it ended start-up in a traceback).
    None at all is a start-up error: nothing would end an answer but max_tokens."""
    ids: set[int] = set()
    gen_cfg = getattr(model, "generation_config", None)
    for source in (getattr(gen_cfg, "eos_token_id", None), getattr(model.config, "eos_token_id", None),
                   tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    vocab = tokenizer.get_vocab()
    harmony = "<|channel|>" in vocab and "<|return|>" in vocab
    for name in ("<|im_end|>", "<|end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"):
        if name in vocab and not (harmony and name == "<|end|>"):
            ids.add(vocab[name])
    past = sorted(i for i in ids if not 0 <= i < logits_width)
    if past:
        log.warning("EOS token ids %s are past the model's %d logits: left out", past, logits_width)
    ids.difference_update(past)
    if not ids:
        raise ModelLoadError("the model names no end-of-sequence token (eos_token_id in its config, generation "
                             "config or tokenizer): nothing would end an answer")
    return frozenset(ids)


def _builtin_model(dtype: torch.dtype) -> tuple[torch.nn.Module, object]:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(BUILTIN_DIR))
    vocab = tokenizer.get_vocab()
    config = Qwen2Config(
        vocab_size=151936,  # Qwen2's padded logits width: larger than the tokenizer, as in the real models
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=BUILTIN_CONTEXT_LENGTH,
        tie_word_embeddings=True,
        bos_token_id=vocab["<|endoftext|>"],
        eos_token_id=[vocab["<|im_end|>"], vocab["<|endoftext|>"]],
        pad_token_id=vocab["<|endoftext|>"],
    )
    # A private generator keeps the weights identical across runs and machines without touching global state.
    fork_devices: list = []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(BUILTIN_SEED)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    return model.to(dtype), tokenizer


def _learned_positions(model: torch.nn.Module) -> bool:
    """The model looks its positions up in a table (GPT-2's `wpe`, OPT's `embed_positions`): a position past its
    rows is an IndexError on the CPU (the whole batch's step failed with it) and a device-side assert on CUDA.
    Rotary and ALiBi models compute theirs, and may run past their training length."""
    return any(isinstance(module, torch.nn.Embedding) and name.rsplit(".", 1)[-1] in _POSITION_TABLES
               for name, module in model.named_modules())


_POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings")
# The names configs give the positions a model was built for (MPT's `max_seq_len`; most map theirs onto the first)
_CONTEXT_KEYS = ("max_position_embeddings", "max_seq_len", "n_positions", "seq_length", "max_sequence_length")


def _config_context_length(config) -> int | None:
    """The positions the model was built for, read from its text model's config: a multimodal checkpoint loaded as
    a causal LM keeps them in `text_config` (Gemma 3's 131,072), and MPT calls them `max_seq_len` (both fell back
    to 4,096: MPT's ALiBi bias then failed past its 2,048 positions with a 500, QA round 27)."""
    for part in (_text_config(config), config):
        for key in _CONTEXT_KEYS:
            value = getattr(part, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _text_config(config):
    """The config of the model's text decoder (a multimodal checkpoint's `text_config`; MusicGen's `decoder`, where
    two text configs made `get_text_config()` raise)."""
    try:
        return config.get_text_config(decoder=True)
    except ValueError:
        return config


def _recurrent_layers(config) -> list[str]:
    """The layer types of the model whose cache holds a recurrent state rather than keys and values per position
    (Mamba, Jamba, Falcon-H1, Qwen3-Next, LFM2's convolutions; RecurrentGemma, which keeps it on its modules): such
    a state cannot be left-padded or merged into a running batch. Served, they failed every request with an
    IndexError, or (RecurrentGemma) a newcomer's prefill overwrote the running rows' state (QA round 27). Where the
    cache cannot tell (a transformers release before its recurrent layers, a config it cannot read), none are
    named, and `batching_failure` tries the model itself."""
    from transformers import DynamicCache, cache_utils

    recurrent_layer = getattr(cache_utils, "LinearAttentionCacheLayerMixin", None)
    text_config = _text_config(config)
    try:
        layers = DynamicCache(config=text_config).layers if recurrent_layer is not None else []
    except Exception:
        return []
    types = getattr(text_config, "layer_types", None) or []
    recurrent = {types[i] if i < len(types) else type(layer).__name__
                 for i, layer in enumerate(layers) if isinstance(layer, recurrent_layer)}
    return sorted(str(t) for t in recurrent)


def _pin_rotary_frequencies(model, context_length: int) -> None:
    """RoPE that transformers re-chooses at each forward from the longest position in it (`longrope`: Phi-3-128k,
    Phi-3.5-mini, Phi-4-mini; `dynamic` NTK scaling) is fixed once for the context served: one request's answer
    depended on the requests batched with it, and a prompt prefilled in chunks had its early keys rotated one way
    and the later ones another (QA archs F1, F2). Where the context stays within the positions the model was
    trained on, transformers never leaves the original frequencies, and nothing changes; past them, `longrope`
    keeps its long factors and `dynamic` the scaling for the whole context, as vLLM's fixed scaling does."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for module in model.modules():
        kinds = getattr(module, "rope_type", None)
        if not isinstance(kinds, (str, dict)) or not hasattr(module, "config"):
            continue
        for layer_type, kind in (kinds.items() if isinstance(kinds, dict) else [(None, kinds)]):
            if kind != "longrope" and "dynamic" not in str(kind):
                continue
            prefix = f"{layer_type}_" if layer_type is not None else ""  # (Gemma 3 keeps one set per layer type)
            buffer = getattr(module, f"{prefix}inv_freq", None)
            if buffer is None:
                continue
            params = module.config.rope_parameters
            params = params[layer_type] if layer_type is not None else params
            trained = (params.get("original_max_position_embeddings") if kind == "longrope"
                       else getattr(module, "original_max_seq_len", None)) or context_length
            if context_length > trained:
                seq_len = trained + 1 if kind == "longrope" else context_length
                extra = {"layer_type": layer_type} if layer_type is not None else {}
                inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](module.config, buffer.device, seq_len=seq_len, **extra)
                buffer.copy_(inv_freq.to(buffer.dtype))
                setattr(module, f"{prefix}attention_scaling", scaling)
                log.info("RoPE %s: frequencies fixed for the %d-position context, past the %d trained on (for "
                         "every request: --max-model-len %d keeps those of short sequences)", kind, context_length,
                         trained, trained)
            # (a name transformers' per-forward update does not act on)
            pinned = f"{kind} (fixed)".replace("dynamic", "ntk")
            if isinstance(kinds, dict):
                kinds[layer_type] = pinned
            else:
                module.rope_type = pinned


def load_model(name_or_path: str, device: str = "auto", dtype: str = "auto",
               max_model_len: int | None = None) -> LoadedModel:
    """Load `name_or_path` (BUILTIN_MODEL, a local directory or a hub id) onto `device`."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    if name_or_path == BUILTIN_MODEL:
        model, tokenizer = _builtin_model(torch_dtype)
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(name_or_path).expanduser()  # (`~/models/x`, as a shell would not expand it in STRUCTGEN_MODEL)
        looks_local = path.is_absolute() or name_or_path.startswith((".", "~")) or path.exists()
        if looks_local and path.exists() and not path.is_dir():
            raise ModelLoadError(f"not a model directory (a file): {name_or_path}; name the folder that holds it")
        if looks_local and not path.is_dir():
            raise ModelLoadError(f"model directory not found: {name_or_path}")
        source = str(path) if looks_local else name_or_path
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
        except Exception as exc:  # transformers raises many types; the user needs the reason, in one line
            reason = " ".join(str(exc).split())[:300]
            raise ModelLoadError(f"cannot load model {name_or_path!r}: {type(exc).__name__}: {reason}") from None
    try:
        model.to(torch_device).eval()
    except Exception as exc:  # (a device torch names but cannot use here: `mps` on Linux, `meta`, `cuda:7`)
        raise ModelLoadError(f"cannot put the model on device {device!r}: {' '.join(str(exc).split())[:200]}") \
            from None
    recurrent = _recurrent_layers(model.config)
    if recurrent:
        raise ModelLoadError(f"cannot serve model {name_or_path!r}: its layers of type {', '.join(recurrent)} keep a "
                             "recurrent state (Mamba, linear attention, convolutions), which the batched engine "
                             "cannot pad and merge across requests; serve an attention-only model")
    config_len = _config_context_length(model.config) or BUILTIN_CONTEXT_LENGTH
    if max_model_len is not None and max_model_len > config_len:
        if _learned_positions(model):
            raise ModelLoadError(f"--max-model-len {max_model_len} exceeds the {config_len} positions this model "
                                 f"learned (its position embeddings end there)")
        log.warning("--max-model-len %d exceeds the model's %d positions", max_model_len, config_len)
    context_length = max_model_len or config_len
    _pin_rotary_frequencies(model, int(context_length))
    logits_width = model.get_output_embeddings().weight.shape[0]
    loaded = LoadedModel(
        model=model, tokenizer=tokenizer, name=name_or_path, device=torch_device, dtype=torch_dtype,
        context_length=int(context_length), eos_token_ids=_eos_token_ids(model, tokenizer, logits_width),
        logits_width=int(logits_width),
    )
    from engine.model_runner import batching_failure  # (the runner imports this module)

    failure = batching_failure(loaded)
    if failure is not None:
        raise ModelLoadError(f"cannot serve model {name_or_path!r}: two requests in one batch, as the engine runs "
                             f"them, go wrong: {failure}")
    return loaded
