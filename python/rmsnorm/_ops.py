"""_ops.py - the op table (python/src/ops.def, shipped as rmsnorm/_torch_src/ops.def) as
Python reads it: the rmsnorm:: torch ops (id, kind, kernel, schema) and the public functions
(name, where, op, parameters). rmsnorm._torch_fake and rmsnorm.torch derive from it."""

from __future__ import annotations

import ast
import os
import re
from typing import NamedTuple

DEF_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_src", "ops.def")


class Op(NamedTuple):
    id: str
    kind: str  # DIFF, BACKWARD, INPLACE or NOGRAD
    kernel: str  # core.hpp's kernel (shared by an op's overloads and variants)
    schema: str  # "name.overload(args) -> returns", without the namespace

    @property
    def name(self) -> str:
        return self.schema.split("(", 1)[0]


class Param(NamedTuple):
    name: str
    default: str | None  # the default's Python source, None when required
    kwonly: bool


class Fn(NamedTuple):
    name: str
    where: str  # NUMPY, TORCH or BOTH
    op: str
    params: tuple
    doc: str


def _fields(text: str) -> list:
    """The comma-separated fields of a row, commas inside string literals kept."""
    return [f.strip() for f in re.findall(r'(?:"(?:[^"\\]|\\.)*"|[^,"])+', text)]


def _string(expr: str, defines: dict) -> str:
    """A C string expression (adjacent literals and #define'd names) as its value."""
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"|(\w+)', expr)
    return "".join(ast.literal_eval(f'"{lit}"') if not name else defines[name]
                   for lit, name in parts)


def _params(signature: str) -> tuple:
    out, kwonly = [], False
    for item in (s.strip() for s in signature.split(",")):
        if item == "*":
            kwonly = True
            continue
        name, _, default = item.partition("=")
        out.append(Param(name.strip(), default.strip() or None, kwonly))
    return tuple(out)


def load(path: str = DEF_PATH):
    """(ops, fns): the table's RN_OP rows as Op, its RN_FN rows as Fn, in their order."""
    with open(path) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)
    defines, ops, fns = {}, [], []
    for m in re.finditer(r"^#define (\w+) (.*)$", text, re.M):
        defines[m[1]] = _string(m[2], defines)
    # a row runs to its closing parenthesis, over lines; no parenthesis stands outside strings
    for m in re.finditer(r'^RN_(OP|FN)\(((?:"(?:[^"\\]|\\.)*"|[^()"])*)\)', text, re.M):
        fields = _fields(m[2])
        if m[1] == "OP":
            ident, kind, kernel, schema = fields
            ops.append(Op(ident, kind, kernel, _string(schema, defines)))
        else:
            name, where, op, sig, doc = fields
            fns.append(Fn(name, where, _string(op, defines), _params(_string(sig, defines)),
                          _string(doc, defines)))
    return ops, fns


OPS, FNS = load()
