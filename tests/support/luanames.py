"""Which names a Lua chunk uses without declaring them: the test that a verb includes every
helper file it calls (lua/lib), without a Lua interpreter.

Redis refuses a script's read of an undefined global only when that line runs, so a verb that
forgot an include would fail on its first rare path. This reads the composed text the way Lua
5.1 scopes it: ``local`` names are visible after their statement, parameters and ``for``
variables inside their body, blocks end at ``end`` / ``else`` / ``elseif`` / ``until``. Every
name left is a global; only Redis' own may remain. It knows the subset of Lua the scripts
are written in (no ``goto``, no method definitions), which the tests keep it honest on.
"""

from __future__ import annotations

import re

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>--\[(?P<ceq>=*)\[.*?\](?P=ceq)\]|--[^\n]*)
  | (?P<long>\[(?P<leq>=*)\[.*?\](?P=leq)\])
  | (?P<str>'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")
  | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op>\.\.\.|\.\.|==|~=|<=|>=|[-+*/%^\#<>=(){}\[\];:,.])
""", re.VERBOSE | re.DOTALL)

_KEYWORDS = frozenset((
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in",
    "local", "nil", "not", "or", "repeat", "return", "then", "true", "until", "while"))
#: Keywords that can open a statement: met right after a complete expression, they end it.
_STARTS = _KEYWORDS - {"and", "or", "not", "nil", "true", "false", "in", "then"}
#: What Redis gives a script besides its own locals.
REDIS_GLOBALS = frozenset((
    "redis", "KEYS", "ARGV", "string", "math", "table", "tonumber", "tostring", "type",
    "ipairs", "pairs", "unpack", "error", "pcall", "xpcall", "select", "next", "assert",
    "rawget", "rawset", "rawequal", "setmetatable", "getmetatable", "cjson", "cmsgpack",
    "struct", "bit", "_G", "_VERSION"))
#: A top-level declaration: ``local function f`` or ``local a, b`` at the start of a line.
_TOP_LOCAL = re.compile(r"^local\s+(?:function\s+(\w+)|([\w\s,]+?)\s*(?:=|$))", re.MULTILINE)


def tokens(text: str) -> list[tuple[str, str]]:
    """(kind, text) per token, comments and blanks left out: kind is name, kw, lit or op."""
    out: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise ValueError(f"cannot read Lua at offset {pos}: {text[pos:pos + 20]!r}")
        pos = m.end()
        kind, val = m.lastgroup, m.group()
        if kind in ("space", "comment"):
            continue
        if kind in ("long", "str", "num"):
            out.append(("lit", val))
        elif kind == "name":
            out.append(("kw" if val in _KEYWORDS else "name", val))
        else:
            out.append(("op", val))
    return out


def free_names(text: str) -> set[str]:
    """The names a chunk reads or assigns that no enclosing local declares, less Redis' own."""
    toks = tokens(text) + [("eof", "")]
    scopes: list[set[str]] = [set()]
    opened: list[str] = []       # ( [ { and the blocks: function do then else repeat
    free: set[str] = set()
    # A `local a, b = ...` waiting for its expressions to end: (names, depth of `opened`).
    pending: tuple[list[str], int] | None = None
    loop_vars: list[str] = []    # a `for`'s names, declared in the block its `do` opens
    after_operand = False        # the previous token can end an expression

    def use(name: str) -> None:
        if not any(name in s for s in scopes):
            free.add(name)

    i = 0
    while toks[i][0] != "eof":
        kind, val = toks[i]
        if (pending and after_operand and len(opened) == pending[1]
                and (kind == "name" or (kind == "kw" and val in _STARTS) or val == ";")):
            scopes[-1].update(pending[0])
            pending = None
        operand = False
        if val == "local" and toks[i + 1][1] == "function":
            scopes[-1].add(toks[i + 2][1])     # visible in its own body: recursion
            i += 1
            kind, val = toks[i]
        elif val == "local":
            names, j = [toks[i + 1][1]], i + 2
            while toks[j][1] == ",":
                names.append(toks[j + 1][1])
                j += 2
            if toks[j][1] == "=":
                pending = (names, len(opened))
                j += 1
            else:
                scopes[-1].update(names)
            i, after_operand = j, False
            continue
        if val == "function":
            j = i + 1
            if toks[j][0] == "name":             # function NAME(...): assigns NAME
                use(toks[j][1])
                j += 1
                while toks[j][1] in (".", ":"):
                    j += 2
            if toks[j][1] != "(":
                raise ValueError(f"cannot read a function at token {j}: {toks[j]}")
            params, j = set(), j + 1
            while toks[j][1] != ")":
                if toks[j][0] == "name":
                    params.add(toks[j][1])
                j += 1
            scopes.append(params)
            opened.append("function")
            i, after_operand = j + 1, False
            continue
        if val == "for":
            j = i + 1
            while toks[j][1] not in ("=", "in"):
                if toks[j][0] == "name":
                    loop_vars.append(toks[j][1])
                j += 1
            i, after_operand = j + 1, False
            continue
        if kind == "kw":
            if val in ("do", "then", "repeat"):
                scopes.append(set(loop_vars) if val == "do" else set())
                opened.append(val)
                loop_vars = []
            elif val in ("elseif", "else", "end", "until"):
                scopes.pop()
                operand = opened.pop() == "function" and val == "end"
                if val == "else":
                    scopes.append(set())
                    opened.append(val)
            else:
                operand = val in ("nil", "true", "false")
        elif kind == "name":
            field = toks[i - 1][1] in (".", ":")
            key = toks[i + 1][1] == "=" and bool(opened) and opened[-1] == "{"
            if not (field or key):
                use(val)
            operand = True
        elif kind == "lit" or val == "...":
            operand = True
        elif val in ("(", "[", "{"):
            opened.append(val)
        elif val in (")", "]", "}"):
            opened.pop()
            operand = True
        after_operand = operand
        i += 1
    return free - REDIS_GLOBALS


def top_level_names(text: str) -> set[str]:
    """The names a Lua file declares at its top level (a line opening with ``local``)."""
    names: set[str] = set()
    for fn, group in _TOP_LOCAL.findall(text):
        names.update([fn] if fn else [n.strip() for n in group.split(",")])
    return names - {""}
