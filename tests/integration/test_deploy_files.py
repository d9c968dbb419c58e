"""The deployment files under deploy/ against each other and against a real txl-server.

- every YAML file parses; the Kubernetes objects have the kinds, ports, probes, selectors and
  shutdown arithmetic they need; the proxy's upstream list names the StatefulSet's replicas;
- the server's ConfigMap flagfile is accepted by txl-server, which then exports its limits;
- every metric the Grafana dashboard and the Prometheus rules name is served by a running
  txl-server (after it generated tokens), every served metric has a panel;
- promtool accepts the rules and the rendered scrape configuration, and the rules' unit tests pass.

Run by CTest: /usr/bin/python3 test_deploy_files.py --source-dir SRC --bin-dir BUILD
"""
import argparse
import glob
import json
import os
import re
import shutil
import string
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import txl_procs  # noqa: E402

ARGS = None

# docs/DESIGN.md, "Metrics", concept by concept, and the metric family that serves it.
DESIGN_METRICS = {
    "requests by method and status code": "txl_requests_total",
    "time to first token": "txl_time_to_first_token_seconds",
    "inter-token latency": "txl_inter_token_seconds",
    "tokens fed": "txl_tokens_fed_total",
    "tokens generated": "txl_tokens_generated_total",
    "batch size": "txl_batch_size",
    "tokens per engine step": "txl_step_tokens",
    "engine step seconds": "txl_engine_step_seconds",
    "queue depth": "txl_queue_depth",
    "sessions by state": "txl_sessions",
    "session memory bytes": "txl_session_memory_bytes",
    "evictions by reason": "txl_session_evictions_total",
    "build/model info": "txl_build_info",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def deploy(*parts):
    return os.path.join(ARGS.source_dir, "deploy", *parts)


def load_all(path):
    with open(path) as f:
        return list(yaml.safe_load_all(f))


def metric_names(expr):
    """The txl_ metric names (and `up`) a PromQL expression selects; quoted strings removed."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = set(re.findall(r"(?<![A-Za-z0-9_:$])(txl_[A-Za-z0-9_]+|up)(?![A-Za-z0-9_:(])", bare))
    return names


def recorded_names(expr):
    """The recording-rule names (level:metric:operations) an expression uses."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return set(re.findall(r"(?<![A-Za-z0-9_:])(txl:[A-Za-z0-9_:]+)", bare))


def quantity_bytes(q):
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(q))
    return float(m.group(1)) * units.get(m.group(2), 1)


def cpu_cores(q):
    q = str(q)
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def parse_flagfile(text):
    """--name=value lines of an absl flagfile ('#' comments); later lines win."""
    flags = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"--([A-Za-z0-9_]+)(?:=(.*))?", line)
        assert m, f"not a flag line: {line!r}"
        flags[m.group(1)] = m.group(2) if m.group(2) is not None else "true"
    return flags


class DeployYamlTest(unittest.TestCase):
    def test_every_yaml_file_parses(self):
        files = sorted(glob.glob(deploy("**", "*.yaml"), recursive=True) +
                       glob.glob(deploy("**", "*.yml"), recursive=True))
        self.assertGreaterEqual(len(files), 14, files)
        for path in files:
            with self.subTest(path=os.path.relpath(path, ARGS.source_dir)):
                docs = [d for d in load_all(path) if d is not None]
                self.assertTrue(docs, "no document")
                for d in docs:
                    self.assertIsInstance(d, dict)


class KubernetesManifestTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = deploy("k8s")
        cls.kustomization = load_all(os.path.join(cls.dir, "kustomization.yaml"))[0]
        cls.objects = {}
        cls.files = {}
        for name in cls.kustomization["resources"]:
            docs = [d for d in load_all(os.path.join(cls.dir, name)) if d is not None]
            cls.files[name] = docs
            for d in docs:
                cls.objects[(d["kind"], d["metadata"]["name"])] = d
        cls.sts = cls.objects[("StatefulSet", "txl-server")]
        cls.pod = cls.sts["spec"]["template"]
        cls.container = cls.pod["spec"]["containers"][0]
        cls.ports = {p["name"]: p["containerPort"] for p in cls.container["ports"]}
        flags_cm = cls.configmap_of(cls.pod, cls.container, cls.flagfile_path())
        cls.flags = parse_flagfile(flags_cm)
        # Flags given in args come after the flagfile and win.
        for a in cls.container["args"]:
            m = re.fullmatch(r"--([A-Za-z0-9_]+)=(.*)", a)
            if m and m.group(1) != "flagfile":
                cls.flags[m.group(1)] = m.group(2)

    @classmethod
    def flagfile_path(cls):
        paths = [a.split("=", 1)[1] for a in cls.container["args"] if a.startswith("--flagfile=")]
        assert len(paths) == 1, cls.container["args"]
        return paths[0]

    @classmethod
    def configmap_of(cls, pod, container, path):
        """The text of the ConfigMap key that `path` is inside the container."""
        for mount in container["volumeMounts"]:
            prefix = mount["mountPath"].rstrip("/") + "/"
            if path.startswith(prefix):
                volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
                cm = cls.objects[("ConfigMap", volume["configMap"]["name"])]
                return cm["data"][path[len(prefix):]]
        raise AssertionError(f"{path} is not in a mounted volume")

    def pod_labels_match(self, selector, pod):
        labels = pod["metadata"]["labels"]
        for k, v in selector.items():
            self.assertEqual(labels.get(k), v, f"selector {selector} vs pod labels {labels}")

    def test_kustomization_lists_every_manifest_one_object_each(self):
        on_disk = {os.path.basename(p) for p in glob.glob(os.path.join(self.dir, "*.yaml"))} - {"kustomization.yaml"}
        self.assertEqual(set(self.kustomization["resources"]), on_disk)
        for name, docs in self.files.items():
            self.assertEqual(len(docs), 1, f"{name}: one concept per file")
        ns = self.kustomization["namespace"]
        self.assertIn(("Namespace", ns), self.objects)

    def test_expected_kinds(self):
        kinds = sorted(k for k, _ in self.objects)
        self.assertEqual(kinds, sorted(["Namespace", "ConfigMap", "ConfigMap", "StatefulSet", "Service", "Service",
                                        "Service", "PodDisruptionBudget", "PodDisruptionBudget", "PodMonitor",
                                        "Deployment", "PersistentVolumeClaim"]))

    def test_state_dir_is_the_shared_volume(self):
        state_dir = self.flags["state_dir"]
        mount = next(m for m in self.container["volumeMounts"] if m["mountPath"].rstrip("/") == state_dir.rstrip("/"))
        self.assertFalse(mount.get("readOnly", False))
        volume = next(v for v in self.pod["spec"]["volumes"] if v["name"] == mount["name"])
        claim = self.objects[("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])]
        # Every replica mounts the one claim: it must be shareable.
        self.assertEqual(claim["spec"]["accessModes"], ["ReadWriteMany"])
        self.assertEqual(self.pod["spec"]["securityContext"]["fsGroup"], 10001)
        self.assertNotIn("replica_name", self.flags, "the default (the pod's host name) is stable per pod")
        self.assertEqual(self.objects[("PodMonitor", "txl-server")]["apiVersion"], "monitoring.coreos.com/v1")

    def test_container_listens_where_its_ports_and_probes_are(self):
        self.assertEqual(self.container["image"], "txl-serve:latest")
        self.assertEqual(self.container["command"], ["/opt/txl-serve/bin/txl-server"])
        self.assertEqual(self.flags["listen"], f"0.0.0.0:{self.ports['grpc']}")
        self.assertEqual(self.flags["metrics_listen"], f"0.0.0.0:{self.ports['metrics']}")
        self.assertEqual(self.flags["http_listen"], f"0.0.0.0:{self.ports['http']}")
        self.assertEqual(self.flags["model"], "/opt/txl-serve/model/shakespeare_char.pt")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            with self.subTest(probe=probe):
                p = self.container[probe]
                self.assertEqual(set(p) & {"grpc", "httpGet", "tcpSocket", "exec"}, {"grpc"})
                self.assertEqual(p["grpc"]["port"], self.ports["grpc"])
                self.assertNotIn("service", p["grpc"])  # "" is the server's overall status

    def test_grace_period_covers_prestop_and_drain(self):
        spec = self.pod["spec"]
        grace = spec["terminationGracePeriodSeconds"]
        drain = float(self.flags["drain_timeout"])
        pre_stop = self.container["lifecycle"]["preStop"]["exec"]["command"]
        self.assertEqual(pre_stop[:-1], ["/bin/sleep"])
        sleep = float(pre_stop[-1])
        self.assertGreater(sleep, 0)
        # server/serve.cc: after the drain, gRPC Shutdown gets 2 s; then a margin.
        self.assertGreaterEqual(grace, sleep + drain + 2 + 5, (grace, sleep, drain))
        # A draining server answers NOT_SERVING: the liveness probe must not restart it meanwhile.
        live = self.container["livenessProbe"]
        self.assertGreater(live["periodSeconds"] * live["failureThreshold"], drain + 2)

    def test_resources_match_threads_and_memory_budget(self):
        res = self.container["resources"]
        for kind in ("requests", "limits"):
            self.assertIn("cpu", res[kind])
            self.assertIn("memory", res[kind])
        self.assertEqual(int(self.flags["threads"]), cpu_cores(res["limits"]["cpu"]))
        budget = int(self.flags["session_memory_budget"])
        self.assertGreater(budget, 0)
        limit = quantity_bytes(res["limits"]["memory"])
        self.assertGreaterEqual(quantity_bytes(res["requests"]["memory"]), limit)  # Guaranteed QoS
        # Sessions + process (~200 MiB) + step workspace (~512 MiB measured): see the comment there.
        self.assertGreater(limit, budget + 700 * 2**20)

    def test_selectors_match_the_pods(self):
        pod = self.pod
        self.pod_labels_match(self.sts["spec"]["selector"]["matchLabels"], pod)
        self.pod_labels_match(self.objects[("PodDisruptionBudget", "txl-server")]["spec"]["selector"]["matchLabels"], pod)
        monitor = self.objects[("PodMonitor", "txl-server")]["spec"]
        self.pod_labels_match(monitor["selector"]["matchLabels"], pod)
        self.assertEqual([e["port"] for e in monitor["podMetricsEndpoints"]], ["metrics"])
        self.assertEqual(pod["metadata"]["labels"][monitor["jobLabel"]], "txl-server")  # rules.yml's job
        for name in ("txl-server", "txl-server-headless"):
            with self.subTest(service=name):
                svc = self.objects[("Service", name)]["spec"]
                self.pod_labels_match(svc["selector"], pod)
                self.assertEqual({p["name"]: p["port"] for p in svc["ports"]}, self.ports)
                for p in svc["ports"]:
                    self.assertEqual(p["targetPort"], p["name"])
        self.assertEqual(self.objects[("Service", "txl-server")]["spec"]["type"], "ClusterIP")
        headless = self.objects[("Service", "txl-server-headless")]["spec"]
        self.assertEqual(headless["clusterIP"], "None")
        self.assertEqual(self.sts["spec"]["serviceName"], "txl-server-headless")

    def test_proxy_routes_by_session_id_to_every_replica(self):
        proxy = self.objects[("Deployment", "txl-proxy")]
        pod = proxy["spec"]["template"]
        nginx = pod["spec"]["containers"][0]
        self.pod_labels_match(proxy["spec"]["selector"]["matchLabels"], pod)
        self.pod_labels_match(self.objects[("PodDisruptionBudget", "txl-proxy")]["spec"]["selector"]["matchLabels"], pod)
        svc = self.objects[("Service", "txl-proxy")]["spec"]
        self.pod_labels_match(svc["selector"], pod)
        ports = {p["name"]: p["containerPort"] for p in nginx["ports"]}
        self.assertEqual([p["targetPort"] for p in svc["ports"]], ["grpc", "http"])
        conf_path = nginx["command"][nginx["command"].index("-c") + 1]
        conf = self.configmap_of(pod, nginx, conf_path)
        self.assertRegex(conf, rf"listen {ports['grpc']} http2;")
        # The hash key is the session id from metadata (or the request id when there is none).
        self.assertRegex(conf, r"map \$http_txl_session_id \$txl_route \{")
        self.assertRegex(conf, r"hash \$txl_route consistent;")
        ns = self.kustomization["namespace"]
        servers = re.findall(r"^\s*server (\S+) resolve;", conf, re.M)
        # gRPC's upstream, then HTTP's (docs/HTTP.md), each naming every replica.
        expected = [f"txl-server-{i}.txl-server-headless.{ns}.svc.cluster.local:{self.ports[kind]}"
                    for kind in ("grpc", "http") for i in range(self.sts["spec"]["replicas"])]
        self.assertEqual(servers, expected)
        self.assertRegex(conf, rf"listen {ports['http']};")
        self.assertRegex(conf, r'map "\$http_txl_session_id\|\$uri" \$txl_http_route \{')
        self.assertRegex(conf, r"hash \$txl_http_route consistent;")
        for probe in ("readinessProbe", "livenessProbe"):
            self.assertIn(nginx[probe]["httpGet"]["port"], ports)
            self.assertIn(f"listen {ports[nginx[probe]['httpGet']['port']]};", conf)
        self.assertIn(f"location = {nginx['readinessProbe']['httpGet']['path']}", conf)

    def test_proxy_config_mirrors_deploy_nginx(self):
        """The routing directives of deploy/nginx/nginx.conf are in the Kubernetes copy too."""
        path = deploy("nginx", "nginx.conf")
        with open(path) as f:
            template = f.read()
        pod = self.objects[("Deployment", "txl-proxy")]["spec"]["template"]
        nginx = pod["spec"]["containers"][0]
        conf = self.configmap_of(pod, nginx, nginx["command"][nginx["command"].index("-c") + 1])
        squash = lambda s: re.sub(r"\s+", " ", s).strip()
        routing = re.findall(r"^\s*((?:hash|grpc_\w+|keepalive)\b[^;{]*[;{])", template, re.M)
        # The routing key's map block, whole: its body decides where a session goes.
        routing += re.findall(r"^\s*(map \$http_txl_session_id[^}]*\})", template, re.M)
        self.assertTrue(any(d.lstrip().startswith("map") for d in routing))
        for directive in routing:
            self.assertIn(squash(directive), squash(conf), "deploy/nginx/nginx.conf has it, the k8s copy not")

    def test_proxy_config_passes_nginx_t(self):
        """Debian's nginx (1.22) checks the syntax; it predates `resolve`, which is left out here."""
        nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
        self.assertIsNotNone(nginx, "nginx is not installed (scripts/install-deps.sh installs nginx-light)")
        conf = self.objects[("ConfigMap", "txl-proxy-config")]["data"]["nginx.conf"]
        with tempfile.TemporaryDirectory(prefix="txl_nginx_") as tmp:
            conf = conf.replace("/run/nginx", tmp)
            conf = re.sub(r"\S+\.svc\.cluster\.local:(\d+) resolve;", r"127.0.0.1:\1;", conf)
            conf = conf.replace("kube-dns.kube-system.svc.cluster.local", "127.0.0.1")
            path = os.path.join(tmp, "nginx.conf")
            with open(path, "w") as f:
                f.write(conf)
            r = subprocess.run([nginx, "-t", "-p", tmp, "-c", path], capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)

    def test_kustomize_builds(self):
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            self.skipTest("no kubectl")
        r = subprocess.run([kubectl, "kustomize", self.dir], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        built = [d for d in yaml.safe_load_all(r.stdout) if d]
        self.assertEqual(len(built), len(self.objects))
        ns = self.kustomization["namespace"]
        for d in built:
            if d["kind"] != "Namespace":
                self.assertEqual(d["metadata"].get("namespace"), ns, d["metadata"]["name"])


class ServedMetricsTest(unittest.TestCase):
    """Starts txl-server with the ConfigMap's flagfile (a tiny model instead of the bundled one)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="txl_deploy_")
        cm = load_all(deploy("k8s", "server-configmap.yaml"))[0]
        cls.flagfile = os.path.join(cls.tmp.name, "txl-server.flags")
        with open(cls.flagfile, "w") as f:
            f.write(cm["data"]["txl-server.flags"])
        cls.flags = parse_flagfile(cm["data"]["txl-server.flags"])
        model = txl_procs.tiny_model(ARGS.bin_dir, cls.tmp.name)
        # The flagfile's --state_dir is the pod's volume: here, a temporary directory instead.
        cls.server = txl_procs.Server(ARGS.bin_dir, model, "--threads", "1", "--state_dir",
                                      os.path.join(cls.tmp.name, "state"), metrics=True, flagfile=cls.flagfile)
        cls.address, cls.metrics_address = cls.server.address, cls.server.metrics_address
        gen = subprocess.run([os.path.join(ARGS.bin_dir, "client", "txl-client"), "--server", cls.address,
                              "--max_new_tokens", "8", "generate", "hello"], capture_output=True, text=True,
                             timeout=120)
        if gen.returncode != 0:
            cls.stop_server()
            raise RuntimeError("generate failed: " + gen.stderr)
        with urllib.request.urlopen(f"http://{cls.metrics_address}/metrics", timeout=30) as r:
            cls.scrape = r.read().decode()
        cls.samples = {}    # sample name -> list of label dicts
        cls.families = {}   # family -> type
        for l in cls.scrape.splitlines():
            m = re.match(r"# TYPE (\S+) (\S+)", l)
            if m:
                cls.families[m.group(1)] = m.group(2)
            elif l and not l.startswith("#"):
                m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})? \S+", l)
                labels = dict(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
                cls.samples.setdefault(m.group(1), []).append(labels)
        with open(deploy("grafana", "txl-serve.json")) as f:
            cls.dashboard = json.load(f)
        cls.rules = load_all(deploy("prometheus", "rules.yml"))[0]

    @classmethod
    def stop_server(cls):
        cls.server.stop(timeout=30, check=False)

    @classmethod
    def tearDownClass(cls):
        cls.stop_server()
        cls.tmp.cleanup()

    def panels(self):
        out = []
        for p in self.dashboard["panels"]:
            out.extend(p.get("panels", []) if p["type"] == "row" else [p])
        return out

    def known(self, name):
        return name == "up" or name in self.samples

    def test_server_exports_its_configured_limits(self):
        def value(name):
            m = re.search(rf"^{name} (\S+)$", self.scrape, re.M)
            self.assertIsNotNone(m, f"{name} not served")
            return float(m.group(1))
        self.assertEqual(value("txl_sessions_max"), float(self.flags["max_sessions"]))
        self.assertEqual(value("txl_queue_max"), float(self.flags["max_queue"]))
        self.assertEqual(value("txl_session_memory_budget_bytes"), float(self.flags["session_memory_budget"]))
        self.assertGreaterEqual(value("txl_tokens_generated_total"), 8)

    def test_design_metrics_are_served(self):
        for concept, family in DESIGN_METRICS.items():
            self.assertIn(family, self.families, concept)
        self.assertEqual(self.families["txl_time_to_first_token_seconds"], "histogram")

    def test_dashboard_datasource_and_layout(self):
        variables = {v["name"]: v for v in self.dashboard["templating"]["list"]}
        self.assertEqual(variables["datasource"]["type"], "datasource")
        self.assertEqual(variables["datasource"]["query"], "prometheus")
        ids = [p["id"] for p in self.dashboard["panels"]]
        self.assertEqual(len(ids), len(set(ids)))
        for p in self.panels():
            with self.subTest(panel=p["title"]):
                self.assertEqual(p["datasource"], {"type": "prometheus", "uid": "${datasource}"})
                for t in p["targets"]:
                    self.assertEqual(t["datasource"]["uid"], "${datasource}")
                g = p["gridPos"]
                self.assertLessEqual(g["x"] + g["w"], 24)
        cells = {}
        for p in self.dashboard["panels"]:
            g = p["gridPos"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    self.assertNotIn((x, y), cells, f"{p['title']} overlaps {cells.get((x, y))}")
                    cells[(x, y)] = p["title"]

    def test_every_panel_names_a_served_metric(self):
        panels = self.panels()
        self.assertGreaterEqual(len(panels), 15)
        for p in panels:
            with self.subTest(panel=p["title"]):
                self.assertTrue(p["targets"])
                for t in p["targets"]:
                    names = metric_names(t["expr"])
                    self.assertTrue(names, t["expr"])
                    for n in names:
                        self.assertTrue(self.known(n), f"{n} (in {t['expr']}) is not served")

    def test_every_served_metric_has_a_panel_with_its_labels(self):
        used = {}  # family -> legends of the targets that use it
        for p in self.panels():
            for t in p["targets"]:
                for n in metric_names(t["expr"]):
                    for family in self.families:
                        if n == family or (n.startswith(family) and n[len(family):] in HISTOGRAM_SUFFIXES):
                            used.setdefault(family, []).append((t.get("legendFormat", ""), p["type"]))
        for family in sorted(set(self.families) | set(DESIGN_METRICS.values())):
            with self.subTest(metric=family):
                self.assertIn(family, used, "no panel shows it")
                labels = set()
                for name in (family, family + "_bucket"):
                    for ls in self.samples.get(name, []):
                        labels |= set(ls)
                labels -= {"le"}
                if all(kind == "table" for _, kind in used[family]):
                    continue  # a table shows every label
                for label in labels:
                    self.assertTrue(any("{{" + label + "}}" in legend for legend, _ in used[family]),
                                    f"no panel splits {family} by {label}")

    def test_rules_name_served_metrics(self):
        records = set()
        exprs = []
        for group in self.rules["groups"]:
            for rule in group["rules"]:
                exprs.append(rule["expr"])
                if "record" in rule:
                    records.add(rule["record"])
        self.assertGreaterEqual(len(records), 5)
        for expr in exprs:
            with self.subTest(expr=expr):
                names = metric_names(expr)
                self.assertTrue(names or recorded_names(expr), expr)
                for n in names:
                    self.assertTrue(self.known(n), f"{n} is not served")
                for r in recorded_names(expr):
                    self.assertIn(r, records)
        alerts = {r["alert"]: r["expr"] for g in self.rules["groups"] for r in g["rules"] if "alert" in r}
        # The concerns the alerts must cover, by the metrics behind them.
        behind = lambda a: metric_names(alerts[a]) | set().union(
            *[metric_names(r["expr"]) for g in self.rules["groups"] for r in g["rules"]
              if r.get("record") in recorded_names(alerts[a])])
        covered = set().union(*[behind(a) for a in alerts])
        for needed in ("txl_time_to_first_token_seconds_bucket", "txl_queue_depth", "txl_queue_max",
                       "txl_requests_total", "txl_session_memory_budget_bytes", "txl_sessions",
                       "txl_sessions_max", "up"):
            self.assertIn(needed, covered)


class PromtoolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.promtool = shutil.which("promtool") or ("/usr/bin/promtool" if os.path.exists("/usr/bin/promtool") else None)

    def run_promtool(self, *args, cwd=None):
        self.assertIsNotNone(self.promtool, "promtool is not installed (scripts/install-deps.sh installs prometheus)")
        r = subprocess.run([self.promtool] + list(args), capture_output=True, text=True, cwd=cwd, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout + r.stderr

    def test_check_rules(self):
        out = self.run_promtool("check", "rules", deploy("prometheus", "rules.yml"))
        self.assertRegex(out, r"SUCCESS: \d+ rules found")

    def test_rules_unit_tests(self):
        self.run_promtool("test", "rules", "rules_test.yml", cwd=deploy("prometheus"))

    def test_check_rendered_config(self):
        with open(deploy("prometheus", "prometheus.yml")) as f:
            template = f.read()
        self.assertIn("${TXL_METRICS_TARGET}", template)
        with tempfile.TemporaryDirectory(prefix="txl_prom_") as tmp:
            rendered = string.Template(template).substitute(TXL_METRICS_TARGET="127.0.0.1:9464")
            with open(os.path.join(tmp, "prometheus.yml"), "w") as f:
                f.write(rendered)
            shutil.copy(deploy("prometheus", "rules.yml"), tmp)
            out = self.run_promtool("check", "config", os.path.join(tmp, "prometheus.yml"))
            self.assertIn("SUCCESS", out)
            cfg = yaml.safe_load(rendered)
            self.assertEqual(cfg["scrape_configs"][0]["job_name"], "txl-server")
            self.assertEqual(cfg["scrape_configs"][0]["static_configs"][0]["targets"], ["127.0.0.1:9464"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--bin-dir", required=True)
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
