# SPDX-License-Identifier: Apache-2.0
"""The op schemas of csrc/registration.cpp against everything that restates them: the schemas
written out in docs/design.md §2 and in the built extension, the wrappers of mhc_sp.ops (their
parameters and the order they pass them in), the fakes of mhc_sp._fake, the entries of
mhc_sp.testing.OPS and the names the emulated device's World reads its ranks' calls by. An
argument renamed, moved, added or given a default in one place and not in the others fails here."""

import ast
import inspect
import re
from dataclasses import dataclass, fields
from pathlib import Path

import pytest
import torch

from mhc_sp import ops, reference
from mhc_sp.config import MhcConfig
from mhc_sp.testing import OPS

ROOT = Path(__file__).resolve().parents[2]
REGISTRATION = ROOT / "csrc" / "registration.cpp"
DESIGN = ROOT / "docs" / "design.md"
FAKES = ROOT / "python" / "mhc_sp" / "_fake.py"

#: Marks a schema argument without a default.
NO_DEFAULT = inspect.Parameter.empty
#: The scalars a wrapper takes from its MhcConfig instead of one by one (the schemas' scalar tail).
CONFIG_FIELDS = {f.name for f in fields(MhcConfig)}
#: Defaults of the wrappers where the schema has none, the same in every wrapper that takes the
#: argument (None for the group is WORLD).
WRAPPER_DEFAULTS = {
    "norm_weight": None,
    "group": None,
    "sharded": True,
    "num_tokens": -1,
    "cfg": MhcConfig(),
}
#: A config whose scalars all differ, so that each value passed names its field (integers, which
#: every field accepts; no op runs on them).
DISTINCT = MhcConfig(**{name: 11 + i for i, name in enumerate(sorted(CONFIG_FIELDS - {"hc_mult"}))})


@dataclass(frozen=True)
class Arg:
    type: str
    name: str
    default: object = NO_DEFAULT
    keyword_only: bool = False


@dataclass(frozen=True)
class Schema:
    name: str
    args: tuple[Arg, ...]
    #: (type, name or None) of each output.
    returns: tuple[tuple[str, str | None], ...]

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.args]

    @property
    def scalar_tail(self) -> list[str]:
        """The trailing arguments that are MhcConfig fields: what a wrapper's ``cfg`` stands for."""
        tail = []
        for a in reversed(self.args):
            if a.name not in CONFIG_FIELDS:
                break
            tail.insert(0, a.name)
        return tail

    @property
    def before_tail(self) -> list[str]:
        return self.names[: len(self.names) - len(self.scalar_tail)]


def split_top_level(text: str) -> list[str]:
    """``text`` split at the commas outside any brackets, each part stripped ([] for blank)."""
    if not text.strip():
        return []
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return parts + [text[start:].strip()]


def literal(text: str) -> object:
    """A schema default as the Python value it stands for."""
    words = {"True": True, "False": False, "None": None}
    if text in words:
        return words[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if len(text) >= 2 and text[0] in "'\"" and text[-1] == text[0]:
        return text[1:-1]
    raise ValueError(f"default: cannot read {text!r}")


def parse_schema(text: str) -> Schema:
    """``name(Type arg[=default], ...) -> Type | (Type [name], ...)``, with or without the
    ``mhc_sp::`` namespace and whatever whitespace."""
    text = " ".join(text.split())
    m = re.fullmatch(r"(?:mhc_sp::)?(\w+)\((.*)\) ?-> ?(.+)", text)
    assert m, f"not a schema: {text!r}"
    name, args_text, returns_text = m.groups()
    args, keyword_only = [], False
    for part in split_top_level(args_text):
        if part == "*":
            keyword_only = True
            continue
        arg = re.fullmatch(r"(.+?) (\w+)(?: ?= ?(.+))?", part)
        assert arg, f"{name}: cannot read the argument {part!r}"
        kind, arg_name, default = arg.groups()
        default = NO_DEFAULT if default is None else literal(default)
        args.append(Arg(kind, arg_name, default, keyword_only))
    if returns_text.startswith("("):
        returns_text = returns_text[1:-1]
    returns = []
    for part in split_top_level(returns_text):
        kind, _, out_name = part.partition(" ")
        returns.append((kind, out_name or None))
    return Schema(name, tuple(args), tuple(returns))


def registration_schemas() -> dict[str, Schema]:
    """Every ``m.def("...")`` of the TORCH_LIBRARY block of csrc/registration.cpp (adjacent
    string literals joined, as the compiler joins them)."""
    source = REGISTRATION.read_text()
    block = re.search(r"^TORCH_LIBRARY\(mhc_sp, m\) \{$(.*?)^\}$", source, re.S | re.M)
    assert block, "csrc/registration.cpp: no TORCH_LIBRARY(mhc_sp, m) block"
    code = "\n".join(
        line for line in block.group(1).splitlines() if not line.lstrip().startswith("//")
    )
    string = r'"(?:[^"\\]|\\.)*"'
    defs = re.findall(rf"m\.def\(\s*((?:{string}\s*)+)\)\s*;", code)
    assert len(defs) == code.count("m.def("), "an m.def in a form this test does not read"
    schemas = [parse_schema("".join(s[1:-1] for s in re.findall(string, d))) for d in defs]
    by_name = {s.name: s for s in schemas}
    assert len(by_name) == len(schemas), "an op defined twice"
    return by_name


def design_schemas() -> dict[str, Schema]:
    """The schemas written out in the first code block of docs/design.md §2."""
    section = DESIGN.read_text().split("\n## 2. Op schemas\n", 1)[1]
    block = section.split("```", 2)[1]
    chunks = re.split(r"\n(?=\w+\()", block.strip())
    return {s.name: s for s in map(parse_schema, chunks)}


def fake_signatures() -> dict[str, ast.arguments]:
    """The arguments of each ``@register_fake("mhc_sp::<op>")`` function of mhc_sp/_fake.py."""
    out = {}
    for node in ast.parse(FAKES.read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and getattr(deco.func, "id", "") == "register_fake":
                op = deco.args[0].value.removeprefix("mhc_sp::")
                assert op not in out, f"two fakes for {op}"
                out[op] = node.args
    return out


SCHEMAS = registration_schemas()


def test_the_parser_reads_what_the_extension_registered():
    assert len(SCHEMAS) >= 12
    for name, schema in SCHEMAS.items():
        registered = getattr(torch.ops.mhc_sp, name).default._schema
        assert parse_schema(str(registered)) == schema, name


def test_the_emulated_world_reads_each_call_by_its_schema_names():
    """mhc_sp._emulated.World takes each rank's call as the schema's tuple and reads every
    argument by name (csrc/emulation/bindings.cpp): its table of names is the schema's."""
    from mhc_sp.testing import load_emulated_module

    emulated = load_emulated_module()
    if emulated is None:
        pytest.skip("mhc_sp was built without the emulated device (MHC_SP_TESTING=1)")
    tables = emulated.call_schemas()
    assert set(tables) == {
        "fused_layer",
        "fused_entry",
        "fused_head",
        "all_gather",
        "reduce_scatter",
        "all_reduce",
    }
    for op, names in tables.items():
        assert names == SCHEMAS[op].names, op


def test_the_design_doc_writes_out_every_schema_as_registered():
    assert design_schemas() == SCHEMAS


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_wrapper_takes_the_schema_arguments_with_its_config_for_the_scalars(name):
    schema = SCHEMAS[name]
    params = inspect.signature(getattr(ops, name)).parameters
    assert not set(schema.before_tail) & CONFIG_FIELDS, "a config scalar outside the tail"
    assert list(params) == schema.before_tail + (["cfg"] if schema.scalar_tail else [])
    by_name = {a.name: a for a in schema.args}
    for p in params.values():
        assert p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, p
        arg = by_name.get(p.name)
        if arg is not None and arg.default is not NO_DEFAULT:
            expected = arg.default
        else:
            expected = WRAPPER_DEFAULTS.get(p.name, NO_DEFAULT)
        assert p.default == expected, (name, p.name)
        if p.default is None and p.name != "group":  # None reaches the op: it must take None
            assert arg.type.endswith("?"), (name, p.name, arg.type)


class Named:
    """A stand-in argument that the recorded call gives back by name."""

    def __init__(self, name: str):
        self.name = name


class RecordingOps:
    """In place of ``torch.ops.mhc_sp``: keeps each call's op and positional arguments."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, op):
        def record(*args, **kwargs):
            assert not kwargs, f"{op} called with keywords {sorted(kwargs)}"
            self.calls.append((op, args))

        return record


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_wrapper_passes_the_arguments_in_schema_order(name, monkeypatch):
    schema = SCHEMAS[name]
    group, num_tokens = "a-group", 12345  # the wrappers read these two
    given = {n: Named(n) for n in schema.before_tail}
    given.update({k: v for k, v in (("group", group), ("num_tokens", num_tokens)) if k in given})
    if schema.scalar_tail:
        given["cfg"] = DISTINCT
    recorder = RecordingOps()
    monkeypatch.setattr(ops, "_ops", recorder)
    getattr(ops, name)(**given)
    names_of = {group: "group", num_tokens: "num_tokens"}
    names_of.update({getattr(DISTINCT, f): f for f in schema.scalar_tail})
    [(op, args)] = recorder.calls
    assert op == name
    assert [a.name if isinstance(a, Named) else names_of[a] for a in args] == schema.names


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_each_fake_takes_the_schema_arguments(name):
    fakes = fake_signatures()
    assert set(fakes) == set(SCHEMAS)
    args, schema = fakes[name], SCHEMAS[name]
    assert not (args.defaults or args.kwonlyargs or args.kwarg), name
    positional = [a.arg for a in args.args]
    if args.vararg is None:
        assert positional == schema.names
    else:  # the scalar tail may go to *scalars, nothing else
        assert positional == schema.names[: len(positional)]
        assert set(schema.names[len(positional) :]) <= set(schema.scalar_tail), name


def math_ops() -> set[str]:
    """The ops docs/design.md §1 ("The math") has a section for."""
    section = DESIGN.read_text().split("\n## 1. The math\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^### (\w+)$", section, re.M)) & set(SCHEMAS)


#: ``random_inputs`` keys of the schema's tensor arguments, where the names differ.
INPUT_KEYS = {"hc_scale": "scale", "hc_base": "base"}
HEAD_INPUT_KEYS = {"fn": "head_fn", "hc_scale": "head_scale", "hc_base": "head_base"}


def names_and_defaults(function) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(function).parameters.values()]


def test_the_registry_holds_every_math_op_as_its_schema_has_it():
    assert set(OPS) == math_ops() and len(OPS) >= 5
    for name, info in OPS.items():
        schema = SCHEMAS[name]
        assert info.op is getattr(ops, name) and info.reference is getattr(reference, name)
        assert names_and_defaults(info.reference) == names_and_defaults(info.op), name
        aliases = HEAD_INPUT_KEYS if name == "hc_head" else INPUT_KEYS
        assert info.arg_keys == tuple(aliases.get(a, a) for a in schema.before_tail), name
        out_names = [out for _, out in schema.returns]
        assert len(info.outputs) == len(out_names), name
        if all(out_names):
            assert list(info.outputs) == out_names, name
        if schema.scalar_tail:
            assert info.scalars(DISTINCT) == tuple(getattr(DISTINCT, f) for f in schema.scalar_tail)
        else:
            assert info.scalars is None, name
