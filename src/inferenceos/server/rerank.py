"""Rerank: relevance scores of documents for a query, from a reranker GGUF.

A reranker is a GGUF whose `<arch>.pooling_type` is 4 (llama.cpp's
LLAMA_POOLING_TYPE_RANK); `is_reranker` reads it. Each (query, document) pair becomes
one token sequence as llama-server's `format_prompt_rerank` makes it: the model's
`tokenizer.chat_template.rerank` with `{query}` and `{document}` replaced (special
tokens parsed), else `[BOS] query [EOS] [SEP] document [EOS]`, each bracketed token
only where the vocabulary adds it (SEP standing in for a missing EOS). The sequences
go through the embeddings path (engine/embeddings.py: a rank-pooled context gives the
classification head's output per sequence) and the first output is the score.

`rerank_response` shapes the answer as llama-server does: Jina's `{model, object,
usage, results: [{index, relevance_score, document?}]}` sorted by score, best first,
cut to `top_n`; or, for a body with `texts` (Hugging Face TEI's form), the bare list
`[{index, score, text?}]`. `return_documents` (Jina, Cohere) adds `document: {text}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferenceos.server.errors import APIError
from inferenceos.server.vocab import Vocab

POOLING_RANK = "4"  # LLAMA_POOLING_TYPE_RANK, as the GGUF's metadata value reads
MAX_DOCUMENTS = 256


@dataclass(frozen=True)
class RerankRequest:
    """A parsed rerank body."""

    query: str
    documents: list[str]
    top_n: int
    tei: bool  # `texts` was given: answer in TEI's shape
    return_text: bool  # documents in the answer (Jina `return_documents`, TEI `return_text`)


def is_reranker(vocab: Vocab) -> bool:
    """Whether the GGUF declares rank pooling (`<arch>.pooling_type` = 4)."""
    arch = vocab.meta("general.architecture")
    return bool(arch) and vocab.meta(f"{arch}.pooling_type") == POOLING_RANK


def _bad(message: str) -> APIError:
    return APIError(400, message, "invalid_request")


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise _bad(f'"{name}" must be true or false')
    return value


def parse_rerank(body: dict[str, Any]) -> RerankRequest:
    """A rerank body (Jina's `documents` or TEI's `texts`) → RerankRequest; APIError
    400, in llama-server's words where it has them, for anything unusable."""
    query = body.get("query")
    if query is None:
        raise _bad('"query" must be provided')
    if not isinstance(query, str):
        raise _bad('"query" must be a string')
    tei = "texts" in body
    docs = body.get("documents", body.get("texts"))
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise _bad('"documents" must be a non-empty string array')
    if len(docs) > MAX_DOCUMENTS:
        raise _bad(f"at most {MAX_DOCUMENTS} documents per request, got {len(docs)}")
    top_n = body.get("top_n", len(docs))
    if top_n is None:
        top_n = len(docs)
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
        raise _bad(f'"top_n" must be a positive integer, got {top_n!r}')
    return RerankRequest(query, list(docs), top_n, tei,
                         _flag(body, "return_text") if tei else _flag(body, "return_documents"))


def rerank_tokens(vocab: Vocab, query: str, document: str) -> list[int]:
    """The one token sequence the model scores for (query, document) (module contract)."""
    template = vocab.meta("tokenizer.chat_template.rerank")
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        return vocab.tokenize(text, add_special=False, parse_special=True)
    s = vocab.specials
    eos = vocab.eos if vocab.eos >= 0 else s["sep"]
    out = [vocab.bos] if vocab.add_bos else []
    out += vocab.tokenize(query, add_special=False, parse_special=False)
    if s["add_eos"]:
        out.append(eos)
    if s["add_sep"]:
        out.append(s["sep"])
    out += vocab.tokenize(document, add_special=False, parse_special=False)
    if s["add_eos"]:
        out.append(eos)
    return [t for t in out if t >= 0]


def rerank_response(req: RerankRequest, model: str, scores: list[float],
                    n_tokens: int) -> Any:
    """The answer for `scores` (one per document, in order): see the module contract."""
    label = "score" if req.tei else "relevance_score"
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:req.top_n]
    results: list[dict[str, Any]] = []
    for i in order:
        item: dict[str, Any] = {"index": i, label: scores[i]}
        if req.return_text:
            if req.tei:
                item["text"] = req.documents[i]
            else:
                item["document"] = {"text": req.documents[i]}
        results.append(item)
    if req.tei:
        return results
    return {"model": model, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results}


def refuse_embeddings(vocab: Vocab, name: str) -> None:
    """APIError 400 when `name` is a reranker: its pooled output is a score per
    sequence, not an embedding (llama-server's embeddings refuse it too)."""
    if is_reranker(vocab):
        raise APIError(400, f"{name} is a reranker (its pooling type is rank): it scores "
                       "query and document pairs on /v1/rerank and has no embeddings",
                       "not_supported")
