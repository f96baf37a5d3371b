"""Prompt shapes -> token ids, and the context-length rule (truncate `max_tokens` or refuse).

Chat goes through `ChatTemplate`; completions take a string, a list of strings, a list of token ids or a list
of token-id lists (one prompt each). No sampling and no tensors here.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from service.errors import APIError, invalid


@dataclass(frozen=True)
class Prompt:
    ids: list[int]
    text: str  # for `echo`
    param: str = "prompt"  # what errors about it name: `prompt[1]` in a list of prompts
    offsets: tuple[int, ...] | None = None  # where each token starts in `text`, as the tokenizer maps them (echo)
    unfinished: bytes = b""  # the first bytes of a character token ids end inside, which the answer may complete


_COUNT_PIECE_CHARS = 1 << 16  # the pieces a long text is counted in (`encode_prompt`)
_PIECE_SLACK = 8  # tokens a piece's edges may add to a count (a word cut in two, a SentencePiece piece's `▁`)


def encode_prompt(tokenizer, text: str, context_length: int, *, add_special_tokens: bool,
                  param: str = "prompt", what: str | None = None) -> list[int]:
    """The token ids of `text`. A text far longer than the context is first counted in pieces, and refused
    (`context_length_exceeded`) as soon as its count is past the context by more than the pieces' edges could add:
    tokenizing 5 MB of text whole took 4 s and 740 MB, on the one thread that tokenizes every request's prompt.
    `what` the text was made of, for the error (default: the `param`'s name)."""
    if len(text) > 4 * context_length:
        count = 0
        for pieces, start in enumerate(range(0, len(text), _COUNT_PIECE_CHARS), 1):
            count += len(tokenizer.encode(text[start:start + _COUNT_PIECE_CHARS], add_special_tokens=False))
            if count - _PIECE_SLACK * pieces > context_length:
                what, counted = what or _prompt_words(param), start + _COUNT_PIECE_CHARS
                part = f" (the prompt's first {counted} characters do)" if counted < len(text) else ""
                raise APIError(400, f"{_context_words(context_length)} However, your {what} resulted in more than "
                                    f"{context_length} tokens{part}. Please reduce the length of the "
                                    f"{what.replace(' and ', ' or ')}.", param=param, code="context_length_exceeded")
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def encode_chat_prompt(tokenizer, text: str, text_spans: tuple[tuple[int, int], ...], context_length: int,
                       what: str = "messages") -> list[int]:
    """The token ids of a rendered conversation (`encode_prompt`), where the text within `text_spans` (special
    tokens' text that messages spelled: ChatTemplate.render_with_text_spans) is text: the special tokens no span
    overlaps are the template's, and each stretch of text between two of them that a span lies in is tokenized
    again with special tokens read as text (one encode a stretch, as the tokenizer reads the text between two
    special tokens: a token that took in the whitespace beside it, `rstrip`, overlaps its span too)."""
    ids = encode_prompt(tokenizer, text, context_length, add_special_tokens=False, param="messages", what=what)
    if not text_spans:
        return ids
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = sorted(text_spans)
    starts = [a for a, _ in spans]
    out: list[int] = []
    stretch: list[int] = []  # ids of the text since the last template token
    stretch_start, k = 0, 0  # (where that text begins; the first span that does not end before a token)

    def close_stretch(end: int) -> None:
        at = bisect.bisect_left(starts, stretch_start)
        if at < len(spans) and spans[at][0] < end:  # a span lies in it: its text read again
            out.extend(_stretch_as_text(tokenizer, text[stretch_start:end], first=stretch_start == 0))
        else:
            out.extend(stretch)
        stretch.clear()

    for token, (start, end) in zip(encoding["input_ids"], encoding["offset_mapping"]):
        while k < len(spans) and spans[k][1] <= start:
            k += 1
        if token in special and not (k < len(spans) and spans[k][0] < end):  # the template's own
            close_stretch(start)
            out.append(token)
            stretch_start = end
        else:
            stretch.append(token)
    close_stretch(len(text))
    return out


def _stretch_as_text(tokenizer, text: str, first: bool) -> list[int]:
    """The ids of `text`, special tokens' text read as text, as the tokenizer reads text that follows a special
    token (`first`: text at the start of the prompt): encoded alone, or, for a tokenizer that marks only the start
    of the whole input as a word's (SentencePiece's Metaspace "first": `▁`), after a newline whose ids are dropped.
    Which of the two is found by trying both on a probe against the tokenizer's own reading."""
    def encode(t: str) -> list[int]:
        return list(tokenizer.encode(t, add_special_tokens=False, split_special_tokens=True))

    def after_newline(t: str) -> list[int] | None:
        lead, whole = encode("\n"), encode("\n" + t)
        return whole[len(lead):] if whole[:len(lead)] == lead else None

    if first:
        return encode(text)
    probe = "\nfoo bar"
    marker = next(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)
    read = list(tokenizer.encode(marker + probe, add_special_tokens=False))[1:]
    if encode(probe) != read and after_newline(probe) == read:
        return after_newline(text) or encode(text)
    return encode(text)


def completion_prompts(prompt, tokenizer, vocab_limit: int, context_length: int,
                       offsets: bool = False) -> list[Prompt]:
    """One `Prompt` per prompt in the request, in order (with `offsets`, a text's tokens' offsets: `_offsets`). An
    empty text is read as OpenAI reads it, as the start of a document (`_document_start`; it was a 400)."""
    listed = False  # (a list of prompts: errors name the one at fault)
    if isinstance(prompt, str):
        items: list = [prompt]
    elif prompt and all(isinstance(p, int) for p in prompt):
        items = [list(prompt)]
    else:
        items, listed = list(prompt), True
    out = []
    for i, item in enumerate(items):
        param = f"prompt[{i}]" if listed else "prompt"
        if isinstance(item, str):
            ids = (encode_prompt(tokenizer, item, context_length, add_special_tokens=True, param=param)
                   or _document_start(tokenizer))
            if not ids:
                raise invalid("`prompt` must not be empty: the model has no BOS or EOS token to start from", param)
            out.append(Prompt(ids, item, param, _offsets(tokenizer, item, ids) if offsets else None))
        else:
            bad = [t for t in item if t >= vocab_limit]
            if bad:
                raise invalid(f"token id {bad[0]} in `prompt` is out of range: the vocabulary has "
                              f"{vocab_limit} tokens", param)
            # (a prompt past the context is refused (`fit_max_tokens`) without its text: decoding 2 million ids
            # held the interpreter for 2 s)
            text = tokenizer.decode(item, skip_special_tokens=False) if len(item) <= context_length else ""
            out.append(Prompt(list(item), text, param))
    return out


def _offsets(tokenizer, text: str, ids: list[int]) -> tuple[int, ...] | None:
    """Where each of a text prompt's tokens starts in it, as the tokenizer maps them (None: a tokenizer without
    offsets, or other ids than the prompt's). Followed through the text token by token instead, SentencePiece's
    dummy prefix and the space it adds after a special token were taken for the text's: offsets a character late
    (QA tokenizers F1, review4)."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    encoding = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    if list(encoding["input_ids"]) != ids:
        return None
    return tuple(start for start, _ in encoding["offset_mapping"])


def _document_start(tokenizer) -> list[int]:
    """The token a model's documents start with: its BOS, else `<|endoftext|>`, which GPT-style models put between
    documents (and OpenAI reads an empty prompt as), else its EOS (an instruct model's may be `<|im_end|>`); none
    where the tokenizer has none of them."""
    separator = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    for start in (tokenizer.bos_token_id, separator if separator != tokenizer.unk_token_id else None,
                  tokenizer.eos_token_id):
        if isinstance(start, int):
            return [start]
    return []


def fit_max_tokens(prompt_len: int, requested: int | None, default: int | None, context_length: int,
                   behavior: str, prompt_param: str = "messages", tokens_param: str = "max_tokens",
                   what: str | None = None) -> int:
    """The `max_tokens` to run with. `truncate` lowers it to fit the context; `error` refuses (OpenAI's way). The
    errors name the request's fields: `prompt_param` (`messages` or `prompt`; `what` the prompt was made of, where
    more: "messages and tools") and `tokens_param` (`max_tokens` or `max_completion_tokens`). A prompt that fills
    the context is taken only to be scored (`max_tokens: 0`)."""
    room = context_length - prompt_len
    what = what or _prompt_words(prompt_param)
    shorten = what.replace(" and ", " or ")
    if room < 0 or (room == 0 and requested != 0):
        leaves = "" if room < 0 else ", which leaves no room for the completion"
        raise APIError(400, f"{_context_words(context_length)} However, your {what} resulted in {prompt_len} "
                            f"tokens{leaves}. Please reduce the length of the {shorten}.", param=prompt_param,
                       code="context_length_exceeded")
    wanted = requested if requested is not None else (default if default is not None else room)
    if wanted <= room:
        return wanted
    if behavior == "error":
        raise APIError(400, f"{_context_words(context_length)} However, you requested {prompt_len + wanted} tokens "
                            f"({prompt_len} in the {what}, {wanted} in the completion: {tokens_param} is "
                            f"{wanted}). Please reduce the length of the {shorten} or {tokens_param}, or send "
                            f"context_length_exceeded_behavior='truncate'.", param=tokens_param,
                       code="context_length_exceeded")
    return room


def _context_words(context_length: int) -> str:
    """OpenAI's first sentence for a request past the context. Clients match it: litellm raises its
    ContextWindowExceededError (and so tries its `context_window_fallbacks`) only on these words."""
    return f"This model's maximum context length is {context_length} tokens."


def _prompt_words(param: str) -> str:
    return "messages" if param == "messages" else "prompt"  # (`prompt[1]` too: "the prompt")
