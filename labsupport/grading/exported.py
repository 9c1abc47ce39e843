"""A model as data: the operators its forward runs and the tensors they read, rebuilt from an
allowlist.

07 grades a model the student's ``quantize_int8`` made. The grader's judge runs no student code,
so the student's worker exports that model (``torch.export``: one traced forward, ATen operators
and the tensors they read) and :func:`describe` turns the export into plain data: a list of nodes
(JSON: each operator by its name, its arguments as numbers, names of dtypes and references to
earlier nodes) and the tensors. :func:`rebuild` makes a ``torch.fx.GraphModule`` of it again,
calling only operators in :data:`OPERATORS`, with its own node and attribute names: what it
computes is what the nodes say, whatever the student's module did in Python. The notebook's
self-check goes through the same two steps, in one process, so it shows the same table.

A model the export cannot trace, or one whose graph names an operator outside the list, is
refused with a message saying which; the PT2E flow's models (quantise, dequantise, convolution,
linear, pooling, ReLU, add) pass.
"""

from __future__ import annotations

import importlib
import json
import operator
from dataclasses import dataclass

import torch

# The operators a rebuilt model may call: a ResNet's in eval mode, in the forms torch.export and
# the PT2E flow (prepare_pt2e, convert_pt2e with the x86 Inductor quantiser) write them.
OPERATORS = frozenset({
    *(f"aten.{name}" for name in (
        "conv2d.default", "convolution.default", "linear.default", "addmm.default", "mm.default",
        "t.default", "permute.default", "relu.default", "relu_.default", "hardtanh.default",
        "hardtanh_.default", "add.Tensor", "add_.Tensor", "mul.Tensor", "flatten.using_ints",
        "view.default", "reshape.default", "_unsafe_view.default", "adaptive_avg_pool2d.default",
        "_adaptive_avg_pool2d.default", "mean.dim", "max_pool2d.default",
        "max_pool2d_with_indices.default", "batch_norm.default",
        "_native_batch_norm_legit_no_training.default", "clone.default", "contiguous.default",
        "_to_copy.default", "to.dtype", "cat.default", "squeeze.dim", "unsqueeze.default",
        "detach.default", "alias.default", "to.dtype_layout", "_assert_tensor_metadata.default",
        "sub.Tensor", "div.Tensor", "mul.Scalar", "add.Scalar", "expand.default", "dropout.default")),
    *(f"quantized_decomposed.{name}" for name in (
        "quantize_per_tensor.default", "quantize_per_tensor.tensor", "dequantize_per_tensor.default",
        "dequantize_per_tensor.tensor", "quantize_per_channel.default", "dequantize_per_channel.default")),
    "getitem",
})
DTYPES = ("float32", "float16", "bfloat16", "float64", "int8", "uint8", "int32", "int64", "bool")
MEMORY_FORMATS = ("contiguous_format", "channels_last", "preserve_format")
MOST_NODES = 4000
MOST_TENSORS = 2000
MOST_JSON_BYTES = 4 * 2**20


class NotAModel(ValueError):
    """What was described cannot be rebuilt: why, in words a student can act on."""


@dataclass
class Described:
    """A model as data: its nodes (JSON-able) and the tensors its ``tensor`` nodes name by index."""

    nodes: list
    tensors: list[torch.Tensor]

    def encoded(self) -> torch.Tensor:
        """The nodes as a uint8 tensor of JSON, to cross beside the tensors."""
        data = json.dumps(self.nodes).encode()
        return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)

    @classmethod
    def decoded(cls, tensors: list[torch.Tensor]) -> "Described":
        """The inverse of ``[encoded()] + tensors``, checked to be bounded JSON."""
        if not tensors or tensors[0].dtype != torch.uint8 or tensors[0].numel() > MOST_JSON_BYTES:
            raise NotAModel("the exported model's description did not come back")
        try:
            nodes = json.loads(bytes(tensors[0].numpy()))
        except ValueError:
            raise NotAModel("the exported model's description is not JSON") from None
        return cls(nodes, list(tensors[1:]))


def _encode(value, index: dict):
    if isinstance(value, torch.fx.Node):
        return {"node": index[value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_encode(v, index) for v in value]
    if isinstance(value, tuple):
        return {"tuple": [_encode(v, index) for v in value]}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": value.type}
    if isinstance(value, torch.layout):
        return {"layout": str(value).removeprefix("torch.")}
    raise NotAModel(f"an operator argument of type {type(value).__name__}, which a model's description cannot hold")


def _name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    return str(target)  # an OpOverload: "aten.conv2d.default"


def describe(model: torch.nn.Module, batch: torch.Tensor) -> Described:
    """``model`` exported on ``batch`` (``torch.export``, non-strict), as data. Raises
    :class:`NotAModel` where the export fails or holds what cannot be described."""
    try:
        program = torch.export.export(model, (batch,), strict=False)
    except Exception as err:
        raise NotAModel(f"torch.export could not trace your model on a batch of {len(batch)}: "
                        f"{type(err).__name__}: {str(err)[:300]}") from None
    named = {**program.state_dict, **program.constants}
    kinds = {spec.arg.name: spec for spec in program.graph_signature.input_specs}
    index, nodes, tensors = {}, [], []
    for node in program.graph.nodes:
        if node.op == "placeholder":
            spec = kinds.get(node.name)
            if spec is not None and spec.kind.name == "USER_INPUT":
                nodes.append({"op": "input"})
            elif not node.users:  # held, never read (convert_pt2e keeps the fp32 weights it replaced)
                nodes.append({"op": "unused"})
            else:
                value = named.get(spec.target) if spec is not None else None
                if not isinstance(value, torch.Tensor):
                    raise NotAModel(f"the export's input {node.name} is not a tensor the model holds")
                nodes.append({"op": "tensor", "index": len(tensors)})
                tensors.append(value.detach())
        elif node.op == "call_function":
            nodes.append({"op": "call", "target": _name(node.target), "args": _encode(list(node.args), index),
                          "kwargs": {k: _encode(v, index) for k, v in node.kwargs.items()}})
        elif node.op == "output":
            outputs = [value for value, spec in zip(node.args[0], program.graph_signature.output_specs)
                       if spec.kind.name == "USER_OUTPUT"]
            if len(outputs) != 1:
                raise NotAModel(f"your model returns {len(outputs)} values; it must return the logits alone")
            nodes.append({"op": "output", "args": [_encode(outputs[0], index)]})
        else:
            raise NotAModel(f"the export holds a {node.op} node ({node.target}), which a description cannot")
        index[node] = len(nodes) - 1
    return Described(nodes, tensors)


def _operator(name) -> object:
    if not isinstance(name, str) or name not in OPERATORS:
        raise NotAModel(f"your model calls {str(name)[:80]}, which is not among the operators the grader runs "
                        "(a ResNet's in eval mode and the PT2E flow's quantise and dequantise steps): "
                        "quantise with prepare_pt2e and convert_pt2e as the notebook shows")
    if name == "getitem":
        return operator.getitem
    if name.startswith("quantized_decomposed."):
        importlib.import_module("torch.ao.quantization.fx._decomposed")  # registers quantized_decomposed
    namespace, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload)


def rebuild(described: Described) -> torch.fx.GraphModule:
    """The model ``described``, as a GraphModule of its own making (on the CPU, in eval mode):
    allowlisted operators only, every argument checked, node and attribute names its own."""
    nodes, tensors = described.nodes, described.tensors
    if not isinstance(nodes, list) or not 0 < len(nodes) <= MOST_NODES or len(tensors) > MOST_TENSORS:
        raise NotAModel(f"a description of {len(nodes) if isinstance(nodes, list) else '?'} nodes and "
                        f"{len(tensors)} tensors (at most {MOST_NODES} and {MOST_TENSORS})")
    root, graph, made, inputs, output = torch.nn.Module(), torch.fx.Graph(), [], 0, False

    def decode(value):
        if value is None or isinstance(value, (bool, int, float, str)):
            if isinstance(value, str) and len(value) > 64:
                raise NotAModel("an operator argument that is a long string")
            return value
        if isinstance(value, list):
            return [decode(v) for v in value]
        if isinstance(value, dict) and len(value) == 1:
            (kind, inner), = value.items()
            if kind == "node" and isinstance(inner, int) and not isinstance(inner, bool) and 0 <= inner < len(made) \
                    and made[inner] is not None:
                return made[inner]
            if kind == "tuple" and isinstance(inner, list):
                return tuple(decode(v) for v in inner)
            if kind == "dtype" and inner in DTYPES:
                return getattr(torch, inner)
            if kind == "memory_format" and inner in MEMORY_FORMATS:
                return getattr(torch, inner)
            if kind == "device" and inner == "cpu":
                return torch.device("cpu")
            if kind == "layout" and inner == "strided":
                return torch.strided
        raise NotAModel(f"an operator argument the grader cannot read: {str(value)[:80]}")

    for node in nodes:
        kind = node.get("op") if isinstance(node, dict) else None
        if output:
            raise NotAModel("nodes after the model's output")
        if kind == "input":
            inputs += 1
            made.append(graph.placeholder(f"x{inputs}"))
        elif kind == "tensor":
            i = node.get("index")
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(tensors):
                raise NotAModel("a weight that is not among the tensors sent")
            root.register_buffer(f"w{len(made)}", tensors[i].to("cpu"))
            made.append(graph.get_attr(f"w{len(made)}"))
        elif kind == "unused":
            made.append(None)
        elif kind == "call":
            target = _operator(node.get("target"))
            args, kwargs = decode(node.get("args")), node.get("kwargs")
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise NotAModel("an operator whose arguments are not a list and a dict")
            # A keyword becomes Python source in the GraphModule's forward: only the operator's own
            # argument names are accepted.
            named = {a.name for a in target._schema.arguments} if hasattr(target, "_schema") else set()
            stray = [k for k in kwargs if k not in named]
            if stray:
                raise NotAModel(f"an operator {node.get('target')} called with an argument it does not have: "
                                f"{str(stray[0])[:60]}")
            made.append(graph.call_function(target, tuple(args), {k: decode(v) for k, v in kwargs.items()}))
        elif kind == "output":
            args = decode(node.get("args"))
            if not isinstance(args, list) or len(args) != 1:
                raise NotAModel("a model output that is not one value")
            graph.output(args[0])
            made.append(None)
            output = True
        else:
            raise NotAModel(f"a node of kind {str(kind)[:40]}")
    if inputs != 1 or not output:
        raise NotAModel(f"a model with {inputs} inputs{'' if output else ' and no output'} (one batch in, logits out)")
    graph.lint()
    module = torch.fx.GraphModule(root, graph)
    return module.eval()
