"""GBNF grammars from clients, checked before they reach llama.cpp.

`check_gbnf(text)` reads a grammar with llama.cpp's own syntax (src/llama-grammar.cpp's
parser: `name ::= alternates` rules, one per line unless inside parentheses, `"..."`
literals, `[...]` / `[^...]` classes, `.`, `<token>` / `<[id]>` and `!<...>` tokens,
`( ... )` groups, `|`, `?`, `*`, `+`, `{m}`, `{m,}`, `{m,n}`, `#` comments) and refuses,
with a message that says where, what llama.cpp would refuse or choke on:

- a syntax error, an undefined rule, no `root` rule;
- left recursion (`a ::= a "x"`, or a repetition of something that can match the empty
  string: llama.cpp refuses both, and a repeated empty match would never end);
- more than `MAX_REPEAT` repetitions (llama.cpp's own limit), nesting deeper than
  `MAX_DEPTH` (its parser recurses), more than `MAX_CHARS` of text.

Refusals are `GrammarError` (a ValueError); the routes turn them into a 400. What
passes may still name a token the model lacks (`<think>`): the engine refuses that
with a 400 when it builds the sampler.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_REPEAT = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD
MAX_DEPTH = 64
MAX_CHARS = 1 << 20
_ESCAPES = {"t", "r", "n", "\\", '"', "[", "]", "-"}
_HEX = {"x": 2, "u": 4, "U": 8}


class GrammarError(ValueError):
    """A grammar llama.cpp would refuse (or hang on); the message says why and where."""


@dataclass
class Item:
    """One element of a sequence: `kind` is lit / cls / any / tok / ref / group;
    `empty`: a literal "" (matches nothing); `alts`: a group's alternatives."""

    kind: str
    name: str = ""
    empty: bool = False
    alts: list[list[Item]] = field(default_factory=list)
    min: int = 1
    max: int = 1


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.rules: dict[str, list[list[Item]]] = {}
        self.refs: list[tuple[str, int]] = []

    def fail(self, what: str, at: int | None = None) -> GrammarError:
        at = self.i if at is None else at
        line = self.s.count("\n", 0, at) + 1
        col = at - (self.s.rfind("\n", 0, at) + 1) + 1
        near = self.s[at:at + 20].split("\n")[0]
        return GrammarError(f"grammar: {what} at line {line}, column {col}"
                            + (f" (near {near!r})" if near else ""))

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def space(self, newline_ok: bool) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "#":
                while self.i < len(self.s) and self.s[self.i] not in "\r\n":
                    self.i += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                self.i += 1
            else:
                break

    def name(self) -> str:
        start = self.i
        while _is_word(self.peek()):
            self.i += 1
        if self.i == start:
            raise self.fail("expecting a rule name")
        return self.s[start:self.i]

    def char(self) -> None:
        c = self.peek()
        if not c:
            raise self.fail("unexpected end of input")
        if c != "\\":
            self.i += 1
            return
        e = self.peek(1)
        if e in _HEX:
            digits = self.s[self.i + 2:self.i + 2 + _HEX[e]]
            if len(digits) != _HEX[e] or any(d not in "0123456789abcdefABCDEF"
                                             for d in digits):
                raise self.fail(f"expecting {_HEX[e]} hex digits after \\{e}")
            self.i += 2 + _HEX[e]
        elif e in _ESCAPES:
            self.i += 2
        else:
            raise self.fail(f"unknown escape \\{e}")

    def int_(self) -> int:
        start = self.i
        while self.peek().isdigit() and self.peek().isascii():
            self.i += 1
        if self.i == start:
            raise self.fail("expecting an integer")
        return int(self.s[start:self.i])

    def alternates(self, nested: bool, depth: int) -> list[list[Item]]:
        if depth > MAX_DEPTH:
            raise self.fail(f"groups nested deeper than {MAX_DEPTH}")
        alts = [self.sequence(nested, depth)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            alts.append(self.sequence(nested, depth))
        return alts

    def sequence(self, nested: bool, depth: int) -> list[Item]:
        seq: list[Item] = []
        while self.i < len(self.s):
            c = self.peek()
            if c == '"':
                self.i += 1
                start = self.i
                while self.peek() != '"':
                    self.char()
                seq.append(Item("lit", empty=self.i == start))
                self.i += 1
            elif c == "[":
                self.i += 1
                if self.peek() == "^":
                    self.i += 1
                while self.peek() != "]":
                    self.char()
                    if self.peek() == "-" and self.peek(1) != "]":
                        self.i += 1
                        self.char()
                seq.append(Item("cls"))
                self.i += 1
            elif c in "<!":
                seq.append(self.token())
            elif _is_word(c):
                at = self.i
                seq.append(Item("ref", self.name()))
                self.refs.append((seq[-1].name, at))
            elif c == "(":
                self.i += 1
                self.space(True)
                alts = self.alternates(True, depth + 1)
                if self.peek() != ")":
                    raise self.fail("expecting ')'")
                self.i += 1
                seq.append(Item("group", alts=alts))
            elif c == ".":
                self.i += 1
                seq.append(Item("any"))
            elif c in "*+?{":
                self.repeat(seq, nested)
                continue
            else:
                break
            self.space(nested)
        return seq

    def token(self) -> Item:
        if self.peek() == "!":
            self.i += 1
        if self.peek() != "<":
            raise self.fail("expecting '<'")
        end = self.s.find(">", self.i)
        if end < 0 or "\n" in self.s[self.i:end]:
            raise self.fail("expecting '>'")
        body = self.s[self.i + 1:end]
        if body.startswith("[") and not (body.endswith("]") and body[1:-1].isdigit()):
            raise self.fail("a token id is written <[123]>")
        self.i = end + 1
        return Item("tok")

    def repeat(self, seq: list[Item], nested: bool) -> None:
        at, c = self.i, self.peek()
        if not seq:
            raise self.fail(f"'{c}' follows nothing it could repeat")
        self.i += 1
        lo, hi = {"*": (0, -1), "+": (1, -1), "?": (0, 1)}.get(c, (0, 0))
        if c == "{":
            self.space(nested)
            lo = hi = self.int_()
            self.space(nested)
            if self.peek() == ",":
                self.i += 1
                self.space(nested)
                hi = self.int_() if self.peek().isdigit() else -1
                self.space(nested)
            if self.peek() != "}":
                raise self.fail("expecting '}'")
            self.i += 1
            if lo > MAX_REPEAT or hi > MAX_REPEAT:
                raise self.fail(f"more than {MAX_REPEAT} repetitions", at)
            if hi != -1 and hi < lo:
                raise self.fail(f"{{{lo},{hi}}}: the maximum is below the minimum", at)
        last = seq[-1]
        seq[-1] = Item("group", alts=[[last]], min=lo, max=hi)
        self.space(nested)

    def grammar(self) -> None:
        self.space(True)
        while self.i < len(self.s):
            start = self.i
            name = self.name()
            self.space(False)
            if not self.s.startswith("::=", self.i):
                raise self.fail("expecting ::=")
            self.i += 3
            self.space(True)
            alts = self.alternates(False, 0)
            if self.peek() in ("\r", "\n"):
                self.i += 1
            elif self.i < len(self.s):
                raise self.fail("expecting the end of the rule (a newline)")
            if name in self.rules:
                self.rules[name].extend(alts)  # llama.cpp: a later definition adds to it
            else:
                self.rules[name] = alts
            if self.i == start:  # pragma: no cover - every branch consumes input
                raise self.fail("stuck")
            self.space(True)


def _nullable(item: Item, rules: dict[str, list[list[Item]]], known: dict[str, bool]) -> bool:
    if item.min == 0:
        return True
    if item.kind == "lit":
        return item.empty
    if item.kind == "ref":
        return known.get(item.name, False)
    if item.kind == "group":
        return any(all(_nullable(x, rules, known) for x in alt) for alt in item.alts)
    return False


def _nullable_rules(rules: dict[str, list[list[Item]]]) -> dict[str, bool]:
    known = dict.fromkeys(rules, False)
    changed = True
    while changed:
        changed = False
        for name, alts in rules.items():
            if not known[name] and any(all(_nullable(x, rules, known) for x in alt)
                                       for alt in alts):
                known[name] = changed = True
    return known


def _left(seq: list[Item], rules: dict[str, list[list[Item]]], known: dict[str, bool],
          out: set[str]) -> None:
    """The rules `seq` may start with (through nullable prefixes); GrammarError for a
    repetition of something that can match nothing."""
    for item in seq:
        if item.kind == "ref":
            out.add(item.name)
        elif item.kind == "group":
            if item.max == -1 and _nullable(Item("group", alts=item.alts), rules, known):
                raise GrammarError("grammar: a repetition (*, + or {m,}) of something "
                                   "that can match the empty string never ends")
            for alt in item.alts:
                _left(alt, rules, known, out)
        if not _nullable(item, rules, known):
            return


def _check_left_recursion(rules: dict[str, list[list[Item]]]) -> None:
    known = _nullable_rules(rules)
    edges: dict[str, set[str]] = {}
    for name, alts in rules.items():
        edges[name] = set()
        for alt in alts:
            _left(alt, rules, known, edges[name])
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                cycle = " -> ".join([*path[path.index(m):], m]) if m in path else m
                raise GrammarError(f"grammar: left recursion ({cycle}); llama.cpp "
                                   "grammars cannot start a rule with itself")
            if m not in state:
                visit(m, [*path, m])
        state[n] = 2

    for name in rules:
        if name not in state:
            visit(name, [name])


def check_gbnf(text: str) -> str:
    """`text` when llama.cpp can use it as a grammar (root rule "root"); GrammarError
    (see the module contract) otherwise."""
    if not isinstance(text, str) or not text.strip():
        raise GrammarError("grammar: empty; GBNF text with a 'root' rule is expected")
    if len(text) > MAX_CHARS:
        raise GrammarError(f"grammar: longer than {MAX_CHARS} characters")
    if "\0" in text:
        raise GrammarError("grammar: holds a NUL character")
    p = _Parser(text)
    p.grammar()
    for name, at in p.refs:
        if name not in p.rules:
            raise p.fail(f"undefined rule {name!r}", at)
    if "root" not in p.rules:
        raise GrammarError("grammar: no 'root' rule (generation starts at root)")
    _check_left_recursion(p.rules)
    return text
