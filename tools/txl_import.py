#!/usr/bin/python3
"""txl-import: converts Transformer-XL weights trained elsewhere into a txl-serve checkpoint.

  txl-import --source original|hf|nvidia --weights FILE --config CFG.json
             (--vocab FILE | --tokenizer byte | --corpus FILE) --out M.pt

FILE is what Python's torch.save wrote (a state_dict, a dict holding one under
'model_state', 'state_dict' or 'model', or a pickled whole nn.Module, whose class
need not be importable here), or a TorchScript archive. A leading `module.`
(DistributedDataParallel) prefix is stripped. A torch.save file is unpickled: import
only files you trust.

Namings (--source):
  original  the authors' PyTorch MemTransformerLM names (`word_emb.emb_layers.0.weight`,
            `layers.0.dec_attn.qkv_net.weight`, `crit.out_layers.0.weight`, ...).
  hf        Hugging Face TransfoXLLMHeadModel: everything but `crit.` under `transformer.`;
            with untie_r the biases are per layer (`transformer.layers.{i}.dec_attn.r_w_bias`
            [H, dh]) and are stacked into `r_w_bias` [n_layer, H, dh].
  nvidia    NVIDIA DeepLearningExamples PyTorch Transformer-XL: the original names but
            `crit.out_layers_weights.{i}` / `crit.out_layers_biases.{i}`; tied output
            tables and projections are simply absent, and `crit.shared_out_projs.{i}`
            (a second registration of `word_emb.emb_projs`) must equal the embedding's.
            For their TorchScript export the tensors kept in list attributes
            (`word_emb.emb_projs`, `crit.out_projs`, `crit.out_layers_weights`,
            `crit.out_layers_biases`) are read too.

Tail-cluster order (which head column holds the log-prob of tail cluster i):
  original  column -i ("reversed"): `head_logprob_i[:, -i]` in the authors' code.
  hf        column cutoffs[0] + i - 1 ("sequential"): `cluster_prob_idx = self.cutoffs[0]
            + i - 1` in ProjectedAdaptiveLogSoftmax.forward (transformers,
            models/transfo_xl/modeling_transfo_xl_utilities.py), as in the TF code.
  nvidia    column -i ("reversed"): NVIDIA/DeepLearningExamples,
            PyTorch/LanguageModeling/Transformer-XL/pytorch/utils/proj_adaptive_softmax.py
            (`logprob_i = head_logprob_i[:, -i] + ...`), and the same line in their
            TorchScript variant pytorch/inference/proj_adaptive_softmax_jit.py.
A `tail_cluster_order` in CFG.json that contradicts the source is an error.

CFG.json takes the original constructor names (n_token n_layer n_head d_model d_head
d_inner d_embed div_val cutoffs tie_weight tie_projs pre_lnorm untie_r mem_len clamp_len
same_length dropout dropatt). What the tensors determine (n_token, n_layer, n_head,
d_head, d_model, d_inner, d_embed, div_val and cutoffs when there are several embedding
tables, the number of clusters, untie_r, tie_weight / tie_projs when a tied copy is
absent or differs) is inferred and checked against CFG.json; the rest (pre_lnorm,
mem_len, clamp_len, same_length, dropout, dropatt, and cutoffs with div_val 1) comes
from CFG.json or txl-serve's defaults.

Errors (exit 1, message on stderr prefixed `txl-import: `): unreadable input, unknown,
missing or misshapen tensors (named, with expected and actual shapes), a config that
contradicts the tensors (naming the key, its value and the value the tensors imply),
tied copies that differ, non-finite weights, a tokenizer whose size is not n_token.
Usage errors exit 2. The output is written atomically (temporary file + rename).
"""

import argparse
import io
import json
import os
import pickle
import re
import sys
import types
import zipfile
from collections import OrderedDict

import torch
from torch import nn

# The checkpoint format (config keys and defaults, tensor names and shapes, tied pairs,
# writing the archive) lives beside this file, wherever it is run from.
sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from txl_checkpoint_format import (  # noqa: E402
    CONFIG_KEYS, LAYER_RE, LAYER_SUFFIXES, TENSOR_NAME_RE, ConfigError, embed_dim,
    expected_shapes, has_out_projs, inv_freq, tied_pairs, validate_config, with_defaults,
    write_checkpoint)

PROG = "txl-import"

# The rest of the original MemTransformerLM constructor's arguments: accepted so that a config
# copied from the original training script imports; only values serving cannot honour are refused.
# name -> (the values it may have, why others are refused)
ORIGINAL_ONLY_KEYS = OrderedDict([
    ("tgt_len", (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
                 "an integer (the training segment length; serving feeds any length)")),
    ("ext_len", (lambda v: v in (None, 0) or (isinstance(v, int) and not isinstance(v, bool) and v <= 0),
                 "0: the server keeps no extended context beyond mem_len")),
    ("adapt_inp", (lambda v: v is None or isinstance(v, bool), "true or false")),
    ("attn_type", (lambda v: v in (None, 0) and not isinstance(v, bool),
                   "0: only the relative attention of Transformer-XL (attn_type 0) is served")),
    ("sample_softmax", (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v <= 0),
                        "-1 (or 0): sampled softmax is a training device the server does not have")),
])

SOURCES = ("original", "hf", "nvidia")
TAIL_ORDER = {"original": "reversed", "hf": "sequential", "nvidia": "reversed"}
TAIL_ORDER_WHERE = {
    "original": "the authors' PyTorch code reads head column -i",
    "hf": "Hugging Face's ProjectedAdaptiveLogSoftmax.forward reads head column "
          "cutoffs[0] + i - 1",
    "nvidia": "NVIDIA DeepLearningExamples' pytorch/utils/proj_adaptive_softmax.py reads "
              "head column -i",
}


class ImportFailure(Exception):
    """A problem with the input; main() prints it and exits 1."""


def shape_str(shape):
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


# ----------------------------------------------------------------------------- loading


class _Stub:
    """Stands in for a class that cannot be imported here (a pickled nn.Module of a
    training codebase, a vocabulary object, ...). Keeps whatever state it is given."""

    def __init__(self, *args, **kwargs):
        self._stub_args = args

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = dict(state[0] or {}, **state[1])  # (dict state, slot state)
        if isinstance(state, dict):
            self.__dict__.update(state)
        else:
            self._stub_state = state

    def __call__(self, *args, **kwargs):
        return _Stub(*args, **kwargs)


_stub_classes = {}


class _TolerantUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            key = (module, name)
            if key not in _stub_classes:
                _stub_classes[key] = type(name, (_Stub,), {"_stub_of": module + "." + name})
            return _stub_classes[key]


def _tolerant_pickle_module():
    mod = types.ModuleType("txl_import_tolerant_pickle")
    mod.Unpickler = _TolerantUnpickler
    mod.load = lambda f, **kw: _TolerantUnpickler(f, **kw).load()
    mod.loads = lambda b, **kw: _TolerantUnpickler(io.BytesIO(b), **kw).load()
    mod.__version__ = pickle.format_version
    return mod


def _is_torchscript_zip(path):
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return any(n.endswith("/constants.pkl") or "/code/" in n for n in names)


def _module_like(obj):
    d = getattr(obj, "__dict__", None)
    return isinstance(d, dict) and isinstance(d.get("_parameters"), dict) and \
        isinstance(d.get("_modules"), dict)


def _walk_module(obj, prefix, out):
    """state_dict() of a (possibly stubbed) pickled nn.Module, from its __dict__."""
    d = obj.__dict__
    for name, p in d["_parameters"].items():
        if p is not None:
            out[prefix + name] = p
    skip = d.get("_non_persistent_buffers_set") or set()
    for name, b in (d.get("_buffers") or {}).items():
        if b is not None and name not in skip:
            out[prefix + name] = b
    for name, m in d["_modules"].items():
        if m is not None and _module_like(m):
            _walk_module(m, prefix + name + ".", out)


def _script_list_attributes(module, source):
    """Tensors NVIDIA's TorchScript export keeps in list attributes (not in state_dict)."""
    out = OrderedDict()
    if source != "nvidia":
        return out
    wanted = (("word_emb", ("emb_projs",)),
              ("crit", ("out_projs", "out_layers_weights", "out_layers_biases")))
    for prefix in ("", "module."):
        for path, attrs in wanted:
            node = module
            for part in (prefix + path).split("."):
                node = getattr(node, part, None)
                if not isinstance(node, nn.Module):
                    node = None
                    break
            if node is None:
                continue
            for attr in attrs:
                try:
                    value = getattr(node, attr)
                except (AttributeError, RuntimeError):
                    continue
                if isinstance(value, (list, tuple)):
                    for i, x in enumerate(value):
                        if isinstance(x, torch.Tensor):
                            out["%s%s.%s.%d" % (prefix, path, attr, i)] = x
    return out


def _find_state_dict(obj, where):
    if isinstance(obj, torch.jit.ScriptModule):
        return OrderedDict(obj.state_dict())
    if _module_like(obj):
        out = OrderedDict()
        _walk_module(obj, "", out)
        return out
    if isinstance(obj, dict):
        if obj and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
            return OrderedDict(obj)
        for key in ("model_state", "state_dict", "model"):
            if key in obj:
                return _find_state_dict(obj[key], "%s['%s']" % (where, key))
        keys = sorted(str(k) for k in obj)[:12]
        raise ImportFailure(
            "%s is a dict but neither a state_dict (name -> tensor) nor a wrapper with "
            "'model_state', 'state_dict' or 'model'; its keys: %s" % (where, keys))
    raise ImportFailure("%s holds a %s, not a state_dict or an nn.Module"
                        % (where, type(obj).__name__))


def _torch_load(path):
    """torch.load with classes that cannot be imported here replaced by stubs."""
    tolerant = _tolerant_pickle_module()
    try:
        return torch.load(path, map_location="cpu", pickle_module=tolerant)
    except (AttributeError, ImportError):
        # Debian's torch 1.13 (with the weights_only backport) ignores pickle_module
        # unless weights_only is set; for the zip format, call its loader directly.
        if not (zipfile.is_zipfile(path) and hasattr(torch.serialization, "_load") and
                hasattr(torch.serialization, "_open_zipfile_reader")):
            raise
        with open(path, "rb") as f, torch.serialization._open_zipfile_reader(f) as z:
            return torch.serialization._load(z, "cpu", tolerant, encoding="utf-8")


def load_weights(path, source="original"):
    """{source key: tensor} from a torch.save file or a TorchScript archive."""
    if not os.path.isfile(path):
        raise ImportFailure("%s: no such file" % path)
    if _is_torchscript_zip(path):
        try:
            module = torch.jit.load(path, map_location="cpu")
        except Exception as e:  # noqa: BLE001 - torch raises many kinds
            raise ImportFailure("%s: cannot open the TorchScript archive: %s"
                                % (path, str(e).strip().splitlines()[0]))
        sd = OrderedDict(module.state_dict())
        for k, v in _script_list_attributes(module, source).items():
            sd.setdefault(k, v)
        return sd
    try:
        obj = _torch_load(path)
    except Exception as e:  # noqa: BLE001
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ImportFailure("%s: not a file torch.load can read (%s)" % (path, msg))
    sd = _find_state_dict(obj, path)
    if not sd:
        raise ImportFailure("%s: holds no tensors" % path)
    return sd


# ----------------------------------------------------------------------------- namings


def _hint(keys, source):
    ks = list(keys)
    if source != "hf" and any(k.startswith("transformer.") for k in ks):
        return " (keys start with 'transformer.': a Hugging Face state dict? try --source hf)"
    if source != "nvidia" and any(k.startswith("crit.out_layers_weights.") or
                                  k.startswith("crit.out_layers_biases.") for k in ks):
        return " (keys 'crit.out_layers_weights.*': an NVIDIA state dict? try --source nvidia)"
    if source == "nvidia" and any(re.match(r"^crit\.out_layers\.\d+\.", k) for k in ks):
        return " (keys 'crit.out_layers.N.weight': try --source original or hf)"
    return ""


def normalize_names(raw, source):
    """Renames a source state dict to the original names.

    Returns (tensors, origin, aliases): tensors under original names, origin maps each
    original name to the source key it came from, aliases is a list of
    (source key, tensor, original name it must equal) for duplicate registrations.
    """
    keys = list(raw)
    if keys and all(k.startswith("module.") for k in keys):
        raw = OrderedDict((k[len("module."):], v) for k, v in raw.items())
    tensors, origin, aliases, unknown = OrderedDict(), {}, [], []
    per_layer_bias = {"r_w_bias": {}, "r_r_bias": {}}

    def put(name, src_key, t):
        if name in tensors:
            raise ImportFailure("tensor '%s' appears twice (as '%s' and '%s')"
                                % (name, origin[name], src_key))
        tensors[name] = t
        origin[name] = src_key

    for key, t in raw.items():
        if not isinstance(t, torch.Tensor):
            unknown.append(key)
            continue
        name = key
        if source == "hf":
            if key.startswith("transformer."):
                name = key[len("transformer."):]
                m = re.match(r"^layers\.(\d+)\.dec_attn\.(r_w_bias|r_r_bias)$", name)
                if m:
                    per_layer_bias[m.group(2)][int(m.group(1))] = (key, t)
                    continue
            elif not key.startswith("crit."):
                unknown.append(key)
                continue
        elif source == "nvidia":
            m = re.match(r"^crit\.out_layers_(weights|biases)\.(\d+)$", key)
            if m:
                leaf = {"weights": "weight", "biases": "bias"}[m.group(1)]
                name = "crit.out_layers.%s.%s" % (m.group(2), leaf)
            elif re.match(r"^crit\.out_layers\.\d+\.(weight|bias)$", key):
                unknown.append(key)
                continue
            m = re.match(r"^crit\.shared_out_projs\.(\d+)$", key)
            if m:
                aliases.append((key, t, "word_emb.emb_projs.%s" % m.group(1)))
                continue
        put(name, key, t)

    if unknown:
        raise ImportFailure("unknown key%s %s%s" % (
            "s" if len(unknown) > 1 else "", ", ".join("'%s'" % k for k in unknown[:10]) +
            (" and %d more" % (len(unknown) - 10) if len(unknown) > 10 else ""),
            _hint(unknown, source)))

    for bias, layers in per_layer_bias.items():
        if not layers:
            continue
        if bias in tensors:
            raise ImportFailure("both '%s' and per-layer 'transformer.layers.N.dec_attn.%s' "
                                "are present" % (origin[bias], bias))
        # As many as there are layers (a missing last one must not go unnoticed).
        n = 1 + max(list(layers) + [int(m.group(1)) for m in map(LAYER_RE.match, tensors)
                                    if m and m.group(2) in LAYER_SUFFIXES])
        for i in range(n):
            if i not in layers:
                raise ImportFailure("missing key 'transformer.layers.%d.dec_attn.%s' (the "
                                    "per-layer biases of layers %s are present)"
                                    % (i, bias, sorted(layers)))
        first = layers[0][1]
        for i in range(n):
            key, x = layers[i]
            if x.dim() != 2 or x.shape != first.shape:
                raise ImportFailure("shape mismatch: '%s' has shape %s, expected [n_head, d_head]"
                                    " = %s like layer 0's" % (key, shape_str(x.shape),
                                                              shape_str(first.shape)))
        tensors[bias] = torch.stack([layers[i][1] for i in range(n)])
        origin[bias] = "transformer.layers.{0..%d}.dec_attn.%s (stacked)" % (n - 1, bias)
    return tensors, origin, aliases


# ----------------------------------------------------------------------------- config


def read_config(path):
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise ImportFailure("%s: cannot read the config (%s)" % (path, e.strerror or e))
    except UnicodeDecodeError:
        raise ImportFailure("%s: the config is not UTF-8 text" % path)
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise ImportFailure("%s: not valid JSON (%s)" % (path, e))
    if not isinstance(cfg, dict):
        raise ImportFailure("%s: the config must be a JSON object" % path)
    for k in cfg:
        if k not in CONFIG_KEYS and k not in ORIGINAL_ONLY_KEYS:
            raise ImportFailure("%s: config key '%s' is not a known key (known: %s)"
                                % (path, k, " ".join(CONFIG_KEYS + tuple(ORIGINAL_ONLY_KEYS))))
    for k, (ok, allowed) in ORIGINAL_ONLY_KEYS.items():
        if k in cfg and not ok(cfg[k]):
            raise ImportFailure("%s: config key '%s' is %s; txl-serve needs %s"
                                % (path, k, json.dumps(cfg[k]), allowed))
    cfg = {k: v for k, v in cfg.items() if v is not None and k not in ORIGINAL_ONLY_KEYS}
    types_ = {"n_token": int, "n_layer": int, "n_head": int, "d_model": int, "d_head": int,
              "d_inner": int, "d_embed": int, "div_val": int, "mem_len": int,
              "clamp_len": int, "tie_weight": bool, "pre_lnorm": bool, "untie_r": bool,
              "same_length": bool, "dropout": float, "dropatt": float, "tail_cluster_order": str}
    for k, v in cfg.items():
        want = types_.get(k)
        if want is int and (isinstance(v, bool) or not isinstance(v, int)):
            raise ImportFailure("%s: config key '%s' must be an integer, got %s"
                                % (path, k, json.dumps(v)))
        if want is bool and not isinstance(v, bool):
            raise ImportFailure("%s: config key '%s' must be true or false, got %s"
                                % (path, k, json.dumps(v)))
        if want is float and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise ImportFailure("%s: config key '%s' must be a number, got %s"
                                % (path, k, json.dumps(v)))
        if want is str and not isinstance(v, str):
            raise ImportFailure("%s: config key '%s' must be a string, got %s"
                                % (path, k, json.dumps(v)))
    if "cutoffs" in cfg and not (isinstance(cfg["cutoffs"], list) and all(
            isinstance(x, int) and not isinstance(x, bool) for x in cfg["cutoffs"])):
        raise ImportFailure("%s: config key 'cutoffs' must be a list of integers, got %s"
                            % (path, json.dumps(cfg["cutoffs"])))
    if "tie_projs" in cfg and not (isinstance(cfg["tie_projs"], list) and all(
            isinstance(x, bool) for x in cfg["tie_projs"])):
        raise ImportFailure("%s: config key 'tie_projs' must be a list of booleans, got %s"
                            % (path, json.dumps(cfg["tie_projs"])))
    for k in ("dropout", "dropatt"):
        if k in cfg:
            cfg[k] = float(cfg[k])
    return cfg


class _Contradiction(ImportFailure):
    pass


def _contradict(key, cfg_value, implied, evidence):
    raise _Contradiction("config contradicts the tensors: %s is %s in the config, but the "
                         "tensors imply %s (%s)" % (key, json.dumps(cfg_value),
                                                     json.dumps(implied), evidence))


def infer_config(t, user):
    """Values the tensor shapes determine: {key: (value, evidence)}."""
    inf = OrderedDict()

    def dims(name, n):
        x = t.get(name)
        return x is not None and x.dim() == n

    # n_layer: the layer indices of known per-layer tensors.
    idx = set()
    for k in t:
        m = LAYER_RE.match(k)
        if m and m.group(2) in LAYER_SUFFIXES:
            idx.add(int(m.group(1)))
    if idx:
        inf["n_layer"] = (max(idx) + 1, "layers.0 .. layers.%d" % max(idx))
    # d_model.
    for name, dim in (("layers.0.dec_attn.qkv_net.weight", 1), ("layers.0.dec_attn.r_net.weight", 1),
                      ("layers.0.pos_ff.CoreNet.0.weight", 1)):
        if dims(name, 2):
            inf["d_model"] = (int(t[name].shape[dim]), "%s %s" % (name, shape_str(t[name].shape)))
            break
    else:
        if dims("pos_emb.inv_freq", 1):
            inf["d_model"] = (2 * int(t["pos_emb.inv_freq"].shape[0]),
                              "pos_emb.inv_freq %s" % shape_str(t["pos_emb.inv_freq"].shape))
    # n_head, d_head, untie_r.
    for name in ("r_w_bias", "r_r_bias"):
        x = t.get(name)
        if x is None:
            continue
        if x.dim() not in (2, 3):
            raise ImportFailure("shape mismatch: '%s' has shape %s, expected [n_head, d_head] "
                                "or [n_layer, n_head, d_head]" % (name, shape_str(x.shape)))
        ev = "%s %s" % (name, shape_str(x.shape))
        inf["n_head"] = (int(x.shape[-2]), ev)
        inf["d_head"] = (int(x.shape[-1]), ev)
        inf["untie_r"] = (x.dim() == 3, ev)
        break
    # d_inner.
    name = "layers.0.pos_ff.CoreNet.0.weight"
    if dims(name, 2):
        inf["d_inner"] = (int(t[name].shape[0]), "%s %s" % (name, shape_str(t[name].shape)))
    # Embedding / output tables: n_token, d_embed, div_val, cutoffs.
    def tables(fmt):
        out = []
        i = 0
        while fmt % i in t and t[fmt % i].dim() == 2:
            out.append(t[fmt % i])
            i += 1
        return out
    fmt = "word_emb.emb_layers.%d.weight"
    tabs = tables(fmt)
    if not tabs:
        fmt = "crit.out_layers.%d.weight"
        tabs = tables(fmt)
    d_model = inf.get("d_model", (user.get("d_model"),))[0]
    if len(tabs) == 1:
        ev = "%s %s" % (fmt % 0, shape_str(tabs[0].shape))
        inf["n_token"] = (int(tabs[0].shape[0]), ev)
        inf["d_embed"] = (int(tabs[0].shape[1]), ev)
        if dims("crit.cluster_weight", 2):
            cw = t["crit.cluster_weight"]
            inf["n_clusters"] = (int(cw.shape[0]), "crit.cluster_weight %s" % shape_str(cw.shape))
        else:
            inf["n_clusters"] = (0, "no crit.cluster_weight")
    elif len(tabs) > 1:
        rows = [int(x.shape[0]) for x in tabs]
        widths = [int(x.shape[1]) for x in tabs]
        ev = "%s .. %s with %s rows, %s wide" % (fmt % 0, fmt % (len(tabs) - 1), rows, widths)
        inf["n_token"] = (sum(rows), ev)
        inf["cutoffs"] = ([sum(rows[:i + 1]) for i in range(len(rows) - 1)], ev)
        inf["n_clusters"] = (len(rows) - 1, ev)
        inf["d_embed"] = (widths[0], ev)
        if widths[1] < 1 or widths[0] % widths[1] != 0 or widths[0] // widths[1] < 2:
            raise ImportFailure("shape mismatch: %s: the table widths %s do not shrink by an "
                                "integer div_val >= 2" % (ev, widths))
        div = widths[0] // widths[1]
        inf["div_val"] = (div, ev)
        for i, w in enumerate(widths):
            if w != widths[0] // div ** i:
                raise ImportFailure("shape mismatch: '%s' has shape %s, expected %s (d_embed %d "
                                    "/ div_val %d^%d)" % (fmt % i, shape_str(tabs[i].shape),
                                                          shape_str((rows[i], widths[0] // div ** i)),
                                                          widths[0], div, i))
    # d_embed as the config writes it: -1 means d_model.
    if "d_embed" in inf and d_model is not None and inf["d_embed"][0] == d_model:
        inf["d_embed"] = (-1, inf["d_embed"][1] + ", the same as d_model")
    return inf


def _tie_evidence(t, pairs_all):
    """{copy: True (absent: tied) | False (differs: untied) | None (equal: either)}."""
    out = {}
    for copy, owner in pairs_all:
        if owner not in t:
            continue
        if copy not in t:
            out[copy] = True
        elif t[copy].shape != t[owner].shape:
            out[copy] = False  # the shape check reports it
        else:
            out[copy] = None if torch.equal(t[copy].float(), t[owner].float()) else False
    return out


def resolve_config(t, user, source):
    """The full config: defaults < CFG.json < what the tensors imply, with contradictions
    between CFG.json and the tensors reported."""
    order = TAIL_ORDER[source]
    if "tail_cluster_order" in user and user["tail_cluster_order"] != order:
        _contradict("tail_cluster_order", user["tail_cluster_order"], order,
                    "--source %s: %s" % (source, TAIL_ORDER_WHERE[source]))
    inf = infer_config(t, user)
    c = with_defaults(user)
    for key in ("n_layer", "d_model", "n_head", "d_head", "untie_r", "d_inner", "n_token",
                "div_val", "cutoffs"):
        if key not in inf:
            continue
        value, ev = inf[key]
        if key in user and user[key] != value:
            _contradict(key, user[key], value, ev)
        c[key] = value
    if "d_embed" in inf:
        value, ev = inf["d_embed"]
        want = c["d_model"] if value == -1 else value
        if "d_embed" in user:
            have = c["d_model"] if user["d_embed"] == -1 else user["d_embed"]
            if have != want:
                _contradict("d_embed", user["d_embed"], want, ev)
        else:
            c["d_embed"] = value
    if "n_clusters" in inf:
        n_cl, ev = inf["n_clusters"]
        if len(c["cutoffs"]) != n_cl:
            if n_cl > 0 and "cutoffs" not in user:
                raise ImportFailure("the tensors have %d tail clusters (%s) but cutoffs cannot "
                                    "be inferred with a single embedding table (div_val 1): "
                                    "give cutoffs in the config" % (n_cl, ev))
            _contradict("cutoffs", c["cutoffs"], "%d cluster(s)" % n_cl, ev)
        if "div_val" in user and user["div_val"] != 1 and n_cl > 0 and "div_val" not in inf:
            _contradict("div_val", user["div_val"], 1,
                        "one embedding table although there are %d tail clusters" % n_cl)
    # Tying: a missing crit copy means tied; a differing one means untied.
    n_bins = len(c["cutoffs"]) + 1
    div1 = c["div_val"] == 1
    weight_pairs = [("crit.out_layers.%d.weight" % i, "word_emb.emb_layers.%d.weight" % i)
                    for i in range(1 if div1 else n_bins)]
    ev_w = _tie_evidence(t, weight_pairs)
    tied = [v for v in ev_w.values() if v is True]
    untied = [k for k, v in ev_w.items() if v is False]
    if tied and untied:
        raise ImportFailure("tie_weight: '%s' is absent (tied) but '%s' differs from '%s' "
                            "(untied)" % (next(k for k, v in ev_w.items() if v), untied[0],
                                          dict(weight_pairs)[untied[0]]))
    if tied or untied:
        implied = bool(tied)
        copy = next(iter(k for k, v in ev_w.items() if v is not None))
        why = ("'%s' is absent" % copy) if implied else \
            ("'%s' differs from '%s'" % (copy, dict(weight_pairs)[copy]))
        if "tie_weight" in user and user["tie_weight"] != implied:
            _contradict("tie_weight", user["tie_weight"], implied, why)
        c["tie_weight"] = implied
    if has_out_projs(c):
        proj_pairs = [("crit.out_projs.%d" % i, "word_emb.emb_projs.%d" % (0 if div1 else i))
                      for i in range(n_bins)]
        ev_p = _tie_evidence(t, proj_pairs)
        user_tp = user.get("tie_projs")
        if user_tp is not None and user_tp and len(user_tp) != n_bins:
            raise ImportFailure("config key 'tie_projs' must have len(cutoffs)+1 = %d entries, "
                                "got %d" % (n_bins, len(user_tp)))
        tp = [bool(user_tp[i]) if user_tp else False for i in range(n_bins)]
        for i, (copy, owner) in enumerate(proj_pairs):
            v = ev_p.get(copy)
            if v is None:
                continue
            if user_tp and bool(user_tp[i]) != v:
                _contradict("tie_projs", user_tp, [v if j == i else x for j, x in enumerate(tp)],
                            ("'%s' is absent" % copy) if v else
                            ("'%s' differs from '%s'" % (copy, owner)))
            tp[i] = v
        if any(tp) or user_tp:
            c["tie_projs"] = tp
    c["tail_cluster_order"] = order
    try:
        validate_config(c)
    except ConfigError as e:
        raise ImportFailure(str(e))
    return c


# ----------------------------------------------------------------------------- conversion


def convert(raw, source, user_cfg):
    """(config, {original name: float32 tensor}) from a source state dict."""
    t, origin, aliases = normalize_names(raw, source)
    # NVIDIA's TorchScript model always holds word_emb.emb_projs[0], unused when
    # d_embed == d_model with div_val 1 (their forward checks d_proj != d_embed).
    if source == "nvidia" and "word_emb.emb_projs.0" in t and \
            "word_emb.emb_layers.1.weight" not in t and user_cfg.get("div_val", 1) == 1:
        e0, p0 = t.get("word_emb.emb_layers.0.weight"), t["word_emb.emb_projs.0"]
        if e0 is not None and e0.dim() == 2 and p0.dim() == 2 and \
                p0.shape[0] == p0.shape[1] == e0.shape[1]:
            del t["word_emb.emb_projs.0"]
    strange = [origin.get(k, k) for k in t if not TENSOR_NAME_RE.match(k)]
    if strange:
        raise ImportFailure("unknown key%s %s: not a Transformer-XL tensor in the %s naming%s" % (
            "s" if len(strange) > 1 else "", ", ".join("'%s'" % k for k in strange[:10]) +
            (" and %d more" % (len(strange) - 10) if len(strange) > 10 else ""), source,
            _hint(strange, source)))
    c = resolve_config(t, user_cfg, source)
    want = expected_shapes(c)

    def src(name):
        o = origin.get(name, name)
        return "'%s'" % name if o == name else "'%s' (source key '%s')" % (name, o)

    unknown = [k for k in t if k not in want]
    if unknown:
        raise ImportFailure(
            "unknown key%s %s: no such tensor in a model with n_layer=%d, d_model=%d, "
            "d_embed=%d, div_val=%d, cutoffs=%s%s" % (
                "s" if len(unknown) > 1 else "", ", ".join(src(k) for k in unknown[:10]),
                c["n_layer"], c["d_model"], embed_dim(c), c["div_val"], c["cutoffs"],
                _hint([origin.get(k, k) for k in unknown], source)))
    for alias_key, alias_t, owner in aliases:
        if owner not in t:
            raise ImportFailure("unknown key '%s' ('%s' is not in the model)" % (alias_key, owner))
        if alias_t.shape != t[owner].shape or not torch.equal(alias_t.float(), t[owner].float()):
            raise ImportFailure("'%s' should be the same tensor as '%s' but differs"
                                % (alias_key, owner))
    copies = dict(tied_pairs(c))
    out = OrderedDict()
    for name, shape in want.items():
        x = t.get(name)
        if x is None:
            if name == "pos_emb.inv_freq":
                out[name] = inv_freq(c["d_model"])
                continue
            if name in copies and copies[name] in t:
                continue  # filled from its owner below
            sname = _source_name(source, name, c)
            raise ImportFailure("missing key '%s'%s (expected shape %s)" % (
                name, "" if sname == name else " (source key '%s')" % sname, shape_str(shape)))
        if tuple(x.shape) != tuple(shape):
            raise ImportFailure("shape mismatch: %s has shape %s, expected %s"
                                % (src(name), shape_str(x.shape), shape_str(shape)))
        if not x.is_floating_point():
            raise ImportFailure("%s is not floating point (%s)" % (src(name), x.dtype))
        x = x.detach().to(torch.float32).contiguous().clone()
        if not torch.isfinite(x).all():
            bad = (~torch.isfinite(x)).sum().item()
            raise ImportFailure("%s has %d non-finite value%s (NaN or Inf)"
                                % (src(name), bad, "s" if bad > 1 else ""))
        out[name] = x
    for copy, owner in copies.items():
        if copy in out:
            if not torch.equal(out[copy], out[owner]):
                raise ImportFailure("%s is tied to %s (tie_weight/tie_projs) but their values "
                                    "differ" % (src(copy), src(owner)))
        out[copy] = out[owner].clone()
    # The buffer is a function of d_model: check it. A half-precision copy is replaced
    # by the float32 value, so that its rounding does not reach the checkpoint.
    if not torch.allclose(out["pos_emb.inv_freq"].double(), inv_freq(c["d_model"]).double(),
                          rtol=2e-3, atol=0):
        raise ImportFailure("%s differs from 1/10000^(2i/d_model)" % src("pos_emb.inv_freq"))
    if "pos_emb.inv_freq" in t and t["pos_emb.inv_freq"].dtype not in (torch.float32,
                                                                       torch.float64):
        out["pos_emb.inv_freq"] = inv_freq(c["d_model"])
    out = OrderedDict((k, out[k]) for k in want)
    return c, out


def _source_name(source, name, c):
    """The key under which the source naming stores the tensor `name` (for messages)."""
    if source == "hf":
        if name in ("r_w_bias", "r_r_bias") and c["untie_r"]:
            return "transformer.layers.N.dec_attn." + name
        return name if name.startswith("crit.") else "transformer." + name
    if source == "nvidia":
        m = re.match(r"^crit\.out_layers\.(\d+)\.(weight|bias)$", name)
        if m:
            return "crit.out_layers_%s.%s" % ("weights" if m.group(2) == "weight" else "biases",
                                             m.group(1))
    return name


# ----------------------------------------------------------------------------- tokenizer


def _symbol_json(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def _has_space(b):
    s = b.decode("utf-8", errors="surrogateescape")
    return any(ch.isspace() for ch in s)


def _read_nonempty(path, what):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ImportFailure("%s '%s' cannot be opened (%s)" % (what, path, e.strerror or e))
    if not data:
        raise ImportFailure("%s '%s' is empty" % (what, path))
    return data


def vocab_tokenizer(path):
    data = _read_nonempty(path, "vocab file")
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    symbols, seen = [], {}
    for i, line in enumerate(lines):
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line:
            raise ImportFailure("vocab file '%s': line %d is empty" % (path, i + 1))
        if _has_space(line):
            raise ImportFailure("vocab file '%s': line %d contains whitespace: %r"
                                % (path, i + 1, line))
        if line in seen:
            raise ImportFailure("vocab file '%s': line %d duplicates line %d (%r)"
                                % (path, i + 1, seen[line] + 1, line))
        seen[line] = i
        symbols.append(line)
    return {"type": "word", "symbols": [_symbol_json(s) for s in symbols]}


def corpus_tokenizer(path):
    data = _read_nonempty(path, "corpus")
    # surrogateescape turns every byte outside well-formed UTF-8 into its own code
    # point, so each stray byte becomes a one-byte symbol (as Tokenizer::CharFromCorpus).
    chars = set(data.decode("utf-8", errors="surrogateescape"))
    symbols = sorted(ch.encode("utf-8", errors="surrogateescape") for ch in chars)
    return {"type": "char", "symbols": [_symbol_json(s) for s in symbols]}


def tokenizer_size(tok):
    return 256 if tok["type"] == "byte" else len(tok["symbols"])


# ----------------------------------------------------------------------------- CLI


def build_tokenizer(args):
    if args.vocab:
        return vocab_tokenizer(args.vocab)
    if args.corpus:
        return corpus_tokenizer(args.corpus)
    return {"type": "byte"}


def run(args):
    user = read_config(args.config)
    tok = build_tokenizer(args)
    raw = load_weights(args.weights, args.source)
    config, tensors = convert(raw, args.source, user)
    size = tokenizer_size(tok)
    if size != config["n_token"]:
        what = {"byte": "--tokenizer byte has 256 ids",
                "word": "the vocab file '%s' has %d tokens" % (args.vocab, size),
                "char": "the corpus '%s' has %d distinct characters" % (args.corpus, size)}
        raise ImportFailure("tokenizer size mismatch: %s, but the model has n_token=%d"
                            % (what[tok["type"]], config["n_token"]))
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        raise ImportFailure("%s: the output directory does not exist" % args.out)
    try:
        write_checkpoint(args.out, config, tensors, tok)
    except OSError as e:
        raise ImportFailure("%s: cannot write (%s)" % (args.out, e.strerror or e))
    n = sum(x.numel() for x in tensors.values())
    print(json.dumps(OrderedDict([
        ("out", args.out), ("source", args.source), ("tensors", len(tensors)), ("values", n),
        ("n_token", config["n_token"]), ("n_layer", config["n_layer"]),
        ("d_model", config["d_model"]), ("cutoffs", config["cutoffs"]),
        ("tail_cluster_order", config["tail_cluster_order"]), ("tokenizer", tok["type"])])))


def parser():
    doc = __doc__.split("\n\n")
    ap = argparse.ArgumentParser(
        prog=PROG, description=doc[0].split(": ", 1)[1][:1].upper() + doc[0].split(": ", 1)[1][1:],
        epilog="\n\n".join(doc[2:]), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", required=True, choices=SOURCES,
                    help="naming of the weights: original (authors' PyTorch), hf (Hugging "
                         "Face TransfoXLLMHeadModel) or nvidia (DeepLearningExamples)")
    ap.add_argument("--weights", required=True, metavar="FILE",
                    help="torch.save file (state_dict, wrapper dict, pickled module) or "
                         "TorchScript archive")
    ap.add_argument("--config", required=True, metavar="CFG.json",
                    help="hyperparameters under the original constructor names")
    tok = ap.add_mutually_exclusive_group(required=True)
    tok.add_argument("--vocab", metavar="FILE", help="word tokenizer: one token per line")
    tok.add_argument("--tokenizer", choices=("byte",), help="byte tokenizer (n_token 256)")
    tok.add_argument("--corpus", metavar="FILE",
                     help="char tokenizer: the sorted distinct characters of FILE")
    ap.add_argument("--out", required=True, metavar="M.pt", help="checkpoint to write")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)  # usage errors exit 2
    try:
        run(args)
    except ImportFailure as e:
        print("%s: %s" % (PROG, e), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
