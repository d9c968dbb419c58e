"""The txl-serve checkpoint format, for the Python side (docs/FORMATS.md, "Checkpoint").

A checkpoint is a TorchScript archive whose module tree holds every tensor of the
original MemTransformerLM under its original name (`word_emb.emb_layers.0.weight`,
`layers.0.dec_attn.qkv_net.weight`, ..., with `pos_emb.inv_freq` a buffer, the rest
parameters), plus two extra files: `config.json` (the keys of CONFIG_KEYS, in that
order) and `tokenizer.json`. Tied tensors are stored under both names, equal.

This module is the one Python statement of that format: the config keys and
txl-serve's defaults, what the C++ loader accepts of a config, the tensor names and
their shapes, the tied pairs, and writing / reading an archive. It is used by
tools/txl_import.py and by the tests in tests/python (which locate tools/ from their
own path). It holds no model math: the reference forward pass of tests/python stays
independent of it.
"""

import json
import os
import re
import tempfile
from collections import OrderedDict

import torch
from torch import nn

# txl-serve's defaults (model/model_config.h), under the original names, in the order
# config.json lists them.
CONFIG_DEFAULTS = OrderedDict([
    ("n_token", 0),
    ("n_layer", 2),
    ("n_head", 2),
    ("d_model", 64),
    ("d_head", 32),
    ("d_inner", 256),
    ("d_embed", -1),
    ("div_val", 1),
    ("cutoffs", []),
    ("tie_weight", True),
    ("tie_projs", []),
    ("pre_lnorm", False),
    ("untie_r", False),
    ("mem_len", 64),
    ("clamp_len", -1),
    ("same_length", True),
    ("dropout", 0.0),
    ("dropatt", 0.0),
    ("tail_cluster_order", "reversed"),
])
CONFIG_KEYS = tuple(CONFIG_DEFAULTS)

# The tensors stored as buffers; every other tensor is a parameter.
BUFFERS = ("pos_emb.inv_freq",)

# The tensors of each layer, after `layers.N.`.
LAYER_SUFFIXES = (
    "dec_attn.qkv_net.weight", "dec_attn.r_net.weight", "dec_attn.o_net.weight",
    "dec_attn.layer_norm.weight", "dec_attn.layer_norm.bias",
    "pos_ff.CoreNet.0.weight", "pos_ff.CoreNet.0.bias",
    "pos_ff.CoreNet.3.weight", "pos_ff.CoreNet.3.bias",
    "pos_ff.layer_norm.weight", "pos_ff.layer_norm.bias",
)
LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")
# Every original tensor name, whatever the config.
TENSOR_NAME_RE = re.compile(
    r"^(word_emb\.emb_layers\.\d+\.weight|word_emb\.emb_projs\.\d+|pos_emb\.inv_freq|"
    r"r_w_bias|r_r_bias|layers\.\d+\.(" + "|".join(re.escape(x) for x in LAYER_SUFFIXES) +
    r")|crit\.cluster_weight|crit\.cluster_bias|crit\.out_layers\.\d+\.(weight|bias)|"
    r"crit\.out_projs\.\d+)$")


class ConfigError(ValueError):
    """A config the format (or the C++ loader) does not accept."""


# ----------------------------------------------------------------------------- config


def with_defaults(cfg):
    """A copy of cfg (original key names; None means absent) with txl-serve's defaults
    filled in, cutoffs as ints and tie_projs as bools."""
    unknown = set(cfg) - set(CONFIG_KEYS)
    if unknown:
        raise ConfigError("unknown config keys: %s" % sorted(unknown))
    c = dict(CONFIG_DEFAULTS)
    c.update({k: v for k, v in cfg.items() if v is not None})
    c["cutoffs"] = [int(x) for x in c["cutoffs"]]
    c["tie_projs"] = [bool(x) for x in c["tie_projs"]]
    return c


def embed_dim(c):
    """The width of the first embedding table: d_embed, or d_model when it is -1."""
    return c["d_embed"] if c["d_embed"] > 0 else c["d_model"]


def bin_dim(c, i):
    return embed_dim(c) // (c["div_val"] ** i)


def cutoff_ends(c):
    """[0, cutoffs..., n_token]: bin i holds the ids ends[i] <= id < ends[i+1]."""
    return [0] + list(c["cutoffs"]) + [c["n_token"]]


def has_out_projs(c):
    return c["div_val"] != 1 or embed_dim(c) != c["d_model"]


def tie_proj(c, i):
    return i < len(c["tie_projs"]) and bool(c["tie_projs"][i])


def validate_config(c):
    """The checks of model/model_config.cc's Validate(), so that the checkpoint loads.
    Raises ConfigError."""
    def bad(key, why):
        raise ConfigError("config: %s %s" % (key, why))
    for k in ("n_token", "n_layer", "n_head", "d_head", "d_inner", "div_val"):
        if c[k] < 1:
            bad(k, "must be >= 1, got %d" % c[k])
    if c["d_model"] < 2 or c["d_model"] % 2:
        bad("d_model", "must be even and >= 2, got %d" % c["d_model"])
    if c["d_embed"] == 0 or c["d_embed"] < -1:
        bad("d_embed", "must be >= 1, or -1 for d_model, got %d" % c["d_embed"])
    prev = 0
    for x in c["cutoffs"]:
        if x <= prev or x >= c["n_token"]:
            bad("cutoffs", "must be strictly increasing within (0, n_token=%d), got %s"
                % (c["n_token"], c["cutoffs"]))
        prev = x
    if c["div_val"] > 1:
        for i in range(len(c["cutoffs"]) + 1):
            if bin_dim(c, i) < 1:
                bad("div_val", "leaves bin %d with width 0" % i)
    if c["tie_projs"] and len(c["tie_projs"]) != len(c["cutoffs"]) + 1:
        bad("tie_projs", "must have len(cutoffs)+1 = %d entries, got %d"
            % (len(c["cutoffs"]) + 1, len(c["tie_projs"])))
    if c["mem_len"] < 0:
        bad("mem_len", "must be >= 0, got %d" % c["mem_len"])
    for k in ("dropout", "dropatt"):
        if not 0.0 <= c[k] < 1.0:
            bad(k, "must be in [0, 1), got %g" % c[k])


# ----------------------------------------------------------------------------- tensors


def expected_shapes(c):
    """OrderedDict {original name: shape} of every tensor of MemTransformerLM(c), in the
    order of the archive; c is a full config (with_defaults)."""
    d, H, dh, L = c["d_model"], c["n_head"], c["d_head"], c["n_layer"]
    ends = cutoff_ends(c)
    n_bins = len(ends) - 1
    div1 = c["div_val"] == 1
    s = OrderedDict()
    # AdaptiveEmbedding
    if div1:
        s["word_emb.emb_layers.0.weight"] = (c["n_token"], embed_dim(c))
        if embed_dim(c) != d:
            s["word_emb.emb_projs.0"] = (d, embed_dim(c))
    else:
        for i in range(n_bins):
            s["word_emb.emb_layers.%d.weight" % i] = (ends[i + 1] - ends[i], bin_dim(c, i))
        for i in range(n_bins):
            s["word_emb.emb_projs.%d" % i] = (d, bin_dim(c, i))
    bias = (L, H, dh) if c["untie_r"] else (H, dh)
    s["r_w_bias"] = bias
    s["r_r_bias"] = bias
    s["pos_emb.inv_freq"] = (d // 2,)
    layer = dict(zip(LAYER_SUFFIXES, (
        (3 * H * dh, d), (H * dh, d), (d, H * dh), (d,), (d,),
        (c["d_inner"], d), (c["d_inner"],), (d, c["d_inner"]), (d,), (d,), (d,))))
    for l in range(L):
        for suffix in LAYER_SUFFIXES:
            s["layers.%d.%s" % (l, suffix)] = layer[suffix]
    # ProjectedAdaptiveLogSoftmax
    if c["cutoffs"]:
        s["crit.cluster_weight"] = (len(c["cutoffs"]), embed_dim(c))
        s["crit.cluster_bias"] = (len(c["cutoffs"]),)
    for i in range(1 if div1 else n_bins):
        rows = c["n_token"] if div1 else ends[i + 1] - ends[i]
        s["crit.out_layers.%d.weight" % i] = (rows, bin_dim(c, i))
        s["crit.out_layers.%d.bias" % i] = (rows,)
    if has_out_projs(c):
        for i in range(n_bins):
            s["crit.out_projs.%d" % i] = (d, embed_dim(c) if div1 else bin_dim(c, i))
    return s


def tied_pairs(c):
    """[(copy name, owner name)]: the crit tensors that are the embedding's when tied
    (tie_weight for the output tables, tie_projs for the projections)."""
    pairs = []
    n_bins = len(c["cutoffs"]) + 1
    div1 = c["div_val"] == 1
    if c["tie_weight"]:
        for i in range(1 if div1 else n_bins):
            pairs.append(("crit.out_layers.%d.weight" % i, "word_emb.emb_layers.%d.weight" % i))
    if has_out_projs(c):
        for i in range(n_bins):
            if tie_proj(c, i):
                pairs.append(("crit.out_projs.%d" % i, "word_emb.emb_projs.%d" % (0 if div1 else i)))
    return pairs


def inv_freq(d_model):
    """pos_emb.inv_freq as the original PositionalEmbedding computes it (float32)."""
    return 1 / (10000 ** (torch.arange(0.0, d_model, 2.0) / d_model))


# ----------------------------------------------------------------------------- archive


class Node(nn.Module):
    """One node of the archive's module tree; forward is an identity."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def module_tree(tensors, node_class=Node, buffers=BUFFERS):
    """A module tree (of node_class) whose state_dict() names are exactly the keys of
    `tensors`, holding float32 copies: the names in `buffers` as buffers, the rest as
    parameters."""
    root = node_class()
    for name, t in tensors.items():
        parts = name.split(".")
        node = root
        for p in parts[:-1]:
            child = node._modules.get(p)
            if child is None:
                child = node_class()
                node.add_module(p, child)
            node = child
        value = t.detach().clone().float()
        if name in buffers:
            node.register_buffer(parts[-1], value)
        else:
            node.register_parameter(parts[-1], nn.Parameter(value, requires_grad=False))
    return root


def config_json(c):
    """config.json: the keys of CONFIG_KEYS, in that order."""
    out = OrderedDict()
    for k in CONFIG_KEYS:
        v = c[k]
        out[k] = list(v) if isinstance(v, (list, tuple)) else v
    return json.dumps(out, indent=2)


def write_checkpoint(path, config, tensors, tokenizer):
    """Writes the archive atomically (a temporary file beside `path`, then a rename):
    `tensors` in their order, config.json from the full config, tokenizer.json."""
    scripted = torch.jit.script(module_tree(tensors))
    extra = {"config.json": config_json(config),
             "tokenizer.json": json.dumps(tokenizer, ensure_ascii=False)}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix="." + os.path.basename(path) + ".",
                               suffix=".tmp")
    os.close(fd)
    try:
        scripted.save(tmp, _extra_files=extra)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_checkpoint(path):
    """(module, config dict or None, tokenizer dict or None) of an archive."""
    extra = {"config.json": "", "tokenizer.json": ""}
    module = torch.jit.load(path, map_location="cpu", _extra_files=extra)
    cfg = json.loads(extra["config.json"]) if extra["config.json"] else None
    tok = json.loads(extra["tokenizer.json"]) if extra["tokenizer.json"] else None
    return module, cfg, tok
