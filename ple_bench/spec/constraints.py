"""The constraint language of a suite's ``constraints = [...]``: a named constraint or a small,
checked expression over a case's axes and a few derived names (``world_size``, ``row_bytes``, ...),
evaluated without ``eval``."""

from __future__ import annotations

import ast
import operator
from typing import Any, Callable

from .. import workload
from ..parallel import Topology, TopologyError
from ..units import BadValue
from .axes import AXES


def valid_topology(env: dict[str, Any]) -> bool:
    try:
        Topology(env["tp"], env["etp"], env["dp"])
        return True
    except TopologyError:
        return False


def ngram_heads(env: dict[str, Any]) -> bool:
    try:
        workload.check_ngram_heads(env["ids"], env["num_heads"])
        return True
    except ValueError:
        return False


NAMED_CONSTRAINTS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "valid_topology": valid_topology,
    "ngram_heads": ngram_heads,
}
CONSTRAINT_NAMES = sorted(set(AXES) | {"world_size", "replicas", "row_bytes", "table_bytes", "num_ids"})

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_CMPOPS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_LITERAL_NAMES = {"true": True, "false": False, "True": True, "False": False}


class Constraint:
    """A named constraint or a parsed expression, evaluated on a case's axes."""

    def __init__(self, text: str):
        if not isinstance(text, str):
            raise BadValue(f"{text!r} is not a string")
        self.text = text
        self.named = NAMED_CONSTRAINTS.get(text.strip())
        if self.named is None:
            try:
                self.tree = ast.parse(text.strip(), mode="eval").body
            except SyntaxError:
                raise BadValue(f"cannot parse constraint {text!r}; {self.help()}") from None
            self._check(self.tree)

    @staticmethod
    def help() -> str:
        return (
            f"allowed: a named constraint ({', '.join(NAMED_CONSTRAINTS)}) or an expression over "
            f"{', '.join(CONSTRAINT_NAMES)} with literals, + - * / // % **, comparisons, in, and/or/not"
        )

    def _check(self, node: ast.AST) -> None:
        ok = (ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
              ast.Compare, ast.Name, ast.Load, ast.Constant, ast.List, ast.Tuple,
              *_BINOPS, *_CMPOPS)
        for sub in ast.walk(node):
            if not isinstance(sub, ok):
                raise BadValue(f"constraint {self.text!r}: {type(sub).__name__} is not allowed; {self.help()}")
            if isinstance(sub, ast.Name) and sub.id not in CONSTRAINT_NAMES and sub.id not in _LITERAL_NAMES:
                raise BadValue(f"constraint {self.text!r}: unknown name {sub.id!r}; {self.help()}")
            if isinstance(sub, ast.Constant) and not isinstance(sub.value, (int, float, str)):
                raise BadValue(f"constraint {self.text!r}: literal {sub.value!r} is not allowed; {self.help()}")

    def __call__(self, env: dict[str, Any]) -> bool:
        if self.named is not None:
            return self.named(env)
        try:
            return bool(self._eval(self.tree, env))
        except (ZeroDivisionError, TypeError, OverflowError) as exc:
            raise BadValue(f"constraint {self.text!r} failed on {brief(env)}: {exc}") from None

    def _eval(self, node: ast.AST, env: dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return _LITERAL_NAMES[node.id] if node.id in _LITERAL_NAMES else env[node.id]
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self._eval(e, env) for e in node.elts]
        if isinstance(node, ast.BoolOp):
            values = (self._eval(v, env) for v in node.values)
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp):
            v = self._eval(node.operand, env)
            return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}[type(node.op)](v)
        if isinstance(node, ast.BinOp):
            left, right = self._eval(node.left, env), self._eval(node.right, env)
            if isinstance(node.op, ast.Pow) and (not isinstance(right, int) or abs(right) > 64):
                raise OverflowError("exponent must be an integer with |exponent| <= 64")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.Compare):
            left = self._eval(node.left, env)
            for op, comp in zip(node.ops, node.comparators):
                right = self._eval(comp, env)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        raise TypeError(f"unsupported expression {type(node).__name__}")  # unreachable after _check


def brief(axes: dict[str, Any]) -> str:
    keys = ("kind", "impl", "dtype", "dim", "vocab_size", "num_heads", "num_tokens", "tp", "etp", "dp", "ids")
    return "{" + ", ".join(f"{k}={axes[k]!r}" for k in keys if k in axes) + "}"
