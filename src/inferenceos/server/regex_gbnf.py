"""Regular expressions and choices → GBNF, for vLLM's `regex` and `choice` constraints.

The output must match the whole regex (vLLM's, and outlines', full-match reading). The
subset served, and its GBNF:

- literal characters (anything but `\\ . [ ] ( ) { } | ? * + ^ $`), and escapes: `\\.`
  and every other escaped punctuation, `\\n \\t \\r \\f \\v \\0`, `\\xHH`, `\\uHHHH`;
- `.` (any character but a newline), `\\d \\w \\s` and `\\D \\W \\S`;
- classes `[abc]`, `[a-z0-9_]`, `[^...]`, with escapes and `\\d \\w \\s` inside;
- groups `( )`, `(?: )` and `(?P<name> )` / `(?<name> )` (captures mean nothing here);
- alternation `|`; quantifiers `?`, `*`, `+`, `{m}`, `{m,}`, `{m,n}` (at most
  `MAX_REPEAT`); `^` at the very start and `$` at the very end (a full match anyway).

Refused with `GrammarError` (a 400 at the routes), naming what: backreferences,
lookarounds, word boundaries (`\\b`, `\\B`), anchors elsewhere, lazy and possessive
quantifiers, inline flags, Unicode properties and a regex Python's `re` cannot
compile. `choice_gbnf(["a", "b"])` is the alternation of those literal strings.
"""

from __future__ import annotations

import re
import warnings

from inferenceos.server.gbnf import MAX_REPEAT, GrammarError, check_gbnf

_META = set("\\.[](){}|?*+^$")
_CLASS_ESC = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " \\t\\n\\r\\x0B\\x0C"}
_CHAR_ESC = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "0": "\0"}
MAX_CHOICES = 1024
_COUNT = re.compile(r"\{(\d*)(,(\d*))?\}")


def _count(pattern: str, at: int) -> tuple[int, int, int] | None:
    """A counted repetition at `at` as Python reads one ({m}, {m,}, {m,n}, {,n}):
    (min, max or -1, its end); None where the "{" is a literal character."""
    m = _COUNT.match(pattern, at)
    if not m or (not m.group(1) and not m.group(3)):
        return None
    lo = int(m.group(1) or 0)
    hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else -1)
    return lo, hi, m.end()


def _gchar(c: str) -> str:
    """One character as GBNF writes it inside a literal or a class."""
    if c.isascii() and (c.isalnum() or c in " _,;:!@%&='~`/<>"):
        return c
    code = ord(c)
    return f"\\x{code:02X}" if code < 0x80 else (f"\\u{code:04X}" if code < 0x10000
                                                 else f"\\U{code:08X}")


def literal(text: str) -> str:
    """A GBNF literal for `text`."""
    return '"' + "".join(_gchar(c) for c in text) + '"'


class _Regex:
    """A recursive-descent reader of the subset, writing GBNF as it goes."""

    def __init__(self, pattern: str) -> None:
        self.p = pattern
        self.i = 0

    def fail(self, what: str) -> GrammarError:
        return GrammarError(f"regex: {what} (at position {self.i} of the pattern)")

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def alternation(self, depth: int = 0) -> str:
        if depth > 64:
            raise self.fail("groups nested deeper than 64")
        alts = [self.sequence(depth)]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence(depth))
        return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"

    def sequence(self, depth: int) -> str:
        parts: list[str] = []
        while self.i < len(self.p) and self.peek() not in "|)":
            atom = self.atom(depth)
            parts.append(self.quantified(atom))
        return " ".join(p for p in parts if p) or '""'

    def atom(self, depth: int) -> str:
        c = self.peek()
        if c == "(":
            return self.group(depth)
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            return "[^\\n]"
        if c == "\\":
            return self.escape()
        if c == "^" and self.i == 0:
            self.i += 1
            return ""
        if c == "$" and self.i == len(self.p) - 1:
            self.i += 1
            return ""
        if c in "^$":
            raise self.fail(f"the anchor {c!r} is only served at the pattern's "
                            "start (^) or end ($)")
        if c in "*+?" or (c == "{" and _count(self.p, self.i)):
            raise self.fail(f"{c!r} follows nothing it could repeat")
        self.i += 1
        return literal(c)

    def group(self, depth: int) -> str:
        self.i += 1
        if self.p.startswith("?:", self.i):
            self.i += 2
        elif self.p.startswith("?P<", self.i) or (self.p.startswith("?<", self.i)
                                                   and self.p[self.i + 2:self.i + 3]
                                                   not in ("=", "!")):
            self.i = self.p.index(">", self.i) + 1
        elif self.peek() == "?":
            raise self.fail("lookarounds, inline flags and other (?...) groups are not "
                            "supported")
        inner = self.alternation(depth + 1)
        if self.peek() != ")":
            raise self.fail("expecting ')'")
        self.i += 1
        return f"({inner})"

    def escape(self) -> str:
        e = self.p[self.i + 1:self.i + 2]
        if e in _CLASS_ESC:
            self.i += 2
            return f"[{_CLASS_ESC[e]}]"
        if e.lower() in _CLASS_ESC:
            self.i += 2
            return f"[^{_CLASS_ESC[e.lower()]}]"
        return literal(self.escaped_char())

    def escaped_char(self) -> str:
        """The character an escape stands for (`\\` at self.i)."""
        e = self.p[self.i + 1:self.i + 2]
        if e in _CHAR_ESC:
            self.i += 2
            return _CHAR_ESC[e]
        if e in ("x", "u"):
            n = 2 if e == "x" else 4
            digits = self.p[self.i + 2:self.i + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"\\{e} needs {n} hex digits")
            self.i += 2 + n
            return chr(int(digits, 16))
        if e and not e.isalnum():
            self.i += 2
            return e
        if e.isdigit():
            raise self.fail("backreferences are not supported")
        raise self.fail(f"the escape \\{e} is not supported" if e else "a trailing '\\'")

    def char_class(self) -> str:
        self.i += 1
        out = "[^" if self.peek() == "^" else "["
        if self.peek() == "^":
            self.i += 1
        first = True
        while self.peek() != "]" or first:
            if not self.peek():
                raise self.fail("expecting ']'")
            first = False
            e = self.p[self.i + 1:self.i + 2] if self.peek() == "\\" else ""
            if e in _CLASS_ESC:
                self.i += 2
                out += _CLASS_ESC[e]
                continue
            if e.lower() in _CLASS_ESC and e:
                raise self.fail(f"\\{e} inside a class is not supported")
            lo = self.class_char()
            if self.peek() == "-" and self.p[self.i + 1:self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self.class_char()
                if ord(hi) < ord(lo):
                    raise self.fail(f"the range {lo}-{hi} is backwards")
                out += f"{_gchar(lo)}-{_gchar(hi)}"
            else:
                out += _gchar(lo)
        self.i += 1
        return out + "]"

    def class_char(self) -> str:
        c = self.peek()
        if c == "\\":
            return self.escaped_char()
        if c == "[" and self.p[self.i + 1:self.i + 2] == ":":
            raise self.fail("POSIX classes ([:alpha:]) are not supported")
        self.i += 1
        return c

    def quantified(self, atom: str) -> str:
        c = self.peek()
        if not atom or not c or c not in "*+?{":
            return atom
        if c == "{":
            count = _count(self.p, self.i)
            if count is None:
                return atom  # a literal "{" as Python reads it: the next atom takes it
            lo, hi, self.i = count
            if lo > MAX_REPEAT or hi > MAX_REPEAT:
                raise self.fail(f"more than {MAX_REPEAT} repetitions")
            suffix = f"{{{lo}}}" if lo == hi else f"{{{lo},{'' if hi < 0 else hi}}}"
        else:
            self.i += 1
            suffix = c
        if self.peek() in ("?", "+"):
            raise self.fail("lazy and possessive quantifiers are not supported")
        return atom + suffix  # an atom is one GBNF item: a group, a class, one character


def regex_gbnf(pattern: str) -> str:
    """A GBNF grammar whose language is the full matches of `pattern` (see the module
    contract); GrammarError for what the subset does not hold."""
    if not isinstance(pattern, str):
        raise GrammarError("regex: must be a string")
    if len(pattern) > 64 * 1024:
        raise GrammarError("regex: longer than 65536 characters")
    try:
        with warnings.catch_warnings():  # "possible nested set": ours to refuse below
            warnings.simplefilter("ignore", FutureWarning)
            re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise GrammarError(f"regex: does not compile: {exc}") from None
    r = _Regex(pattern)
    body = r.alternation()
    if r.i != len(pattern):
        raise r.fail("unbalanced ')'")
    grammar = f"root ::= {body}\n"
    try:
        return check_gbnf(grammar)
    except GrammarError as exc:  # e.g. (a?)*: llama.cpp cannot repeat an empty match
        raise GrammarError(f"regex: not served as a grammar: {exc}") from None


def choice_gbnf(choices: object) -> str:
    """A GBNF grammar whose language is exactly the given strings."""
    if (not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES
            or not all(isinstance(c, str) for c in choices)):
        raise GrammarError(f"choice: a list of 1 to {MAX_CHOICES} strings is expected")
    unique = list(dict.fromkeys(choices))
    return "root ::= " + " | ".join(literal(c) for c in unique) + "\n"
