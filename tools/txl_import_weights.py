"""txl-import's input (tools/txl_import.py runs it): the weights file, read whatever wrote it
(a torch.save file, whose classes need not be importable here, or a TorchScript archive),
and its naming (--source) turned into the original authors' tensor names. Also the
importer's error, ImportFailure.
"""

import io
import os
import pickle
import re
import types
import zipfile
from collections import OrderedDict

import torch
from torch import nn

from txl_checkpoint_format import LAYER_RE, LAYER_SUFFIXES


class ImportFailure(Exception):
    """A problem with the input; txl_import.main() prints it and exits 1."""


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
