"""txl-import's model config (tools/txl_import.py runs it): CFG.json read and checked (the
original constructor's names, and the rest of its arguments where serving can honour them),
the values the tensors' shapes determine, and the two resolved into the checkpoint's config,
with every contradiction between them reported.
"""

import json
from collections import OrderedDict

import torch

from txl_checkpoint_format import (CONFIG_KEYS, LAYER_RE, LAYER_SUFFIXES, ConfigError, has_out_projs,
                                   validate_config, with_defaults)
from txl_import_weights import ImportFailure, shape_str

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

TAIL_ORDER = {"original": "reversed", "hf": "sequential", "nvidia": "reversed"}
TAIL_ORDER_WHERE = {
    "original": "the authors' PyTorch code reads head column -i",
    "hf": "Hugging Face's ProjectedAdaptiveLogSoftmax.forward reads head column "
          "cutoffs[0] + i - 1",
    "nvidia": "NVIDIA DeepLearningExamples' pytorch/utils/proj_adaptive_softmax.py reads "
              "head column -i",
}


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
