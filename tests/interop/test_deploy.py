"""The Kubernetes deployment files of the CSI driver (deploy/): every manifest parses, and the fields
kubelet and the CSI sidecars read agree with each other and with the driver: the driver's name (the
binary's DRIVER_NAME) in the CSIDriver object, the PersistentVolume and the registrar's paths; the
socket the plugin serves (`--endpoint`) is the one the registrar dials (`--csi-address`) and the one
it registers (`--kubelet-registration-path`, on the node); the plugin is privileged, sees kubelet's
directory with Bidirectional propagation and /dev/fuse; the example volume's options are flags of
`shardfs mount`, its attributes the ones the driver knows, its Secret's keys credential variables.

The Helm chart (deploy/helm/shardfs-csi) is checked the same way once rendered. No registry here
(Debian's apt, PyPI, npm) offers `helm`, and none the Kubernetes API schemas with a validator, so
the templates are rendered by the small renderer below, which knows only the forms the templates
use (`.Values`, `.Release`, `.Chart`, `toYaml | nindent`) and fails on any other; where a `helm`
binary is on PATH, `helm template`'s output is checked too.

Needs no FUSE. Runs in target/venv (PyYAML); alone:
``target/venv/bin/python -m pytest tests/interop/test_deploy.py``.
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import BINARY, ROOT

pytestmark = pytest.mark.no_fuse

DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm/shardfs-csi"
DRIVER = re.search(r'pub const DRIVER_NAME: &str = "([^"]+)"', (ROOT / "src/csi.rs").read_text()).group(1)
# The variables and names the driver takes from a Secret (src/csi/volume.rs).
SECRET_KEY = re.compile(r"^(AWS_|AZURE_|GOOGLE_)[A-Z0-9_]+$|^(key_id|access_key|session_token)$")


def manifests():
    docs = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    return docs


def lookup(context, dotted):
    value = context
    for part in dotted.strip(".").split("."):
        value = value[part]
    return value


def render(template, context):
    """A chart template rendered as Helm would, for the forms these templates use alone."""
    def nindent(match):
        value = yaml.safe_dump(lookup(context, match.group(1)), default_flow_style=False, sort_keys=False)
        pad = " " * int(match.group(2))
        return "\n" + "\n".join(pad + line for line in value.rstrip("\n").splitlines())

    text = re.sub(r"\s*\{\{-\s*toYaml\s+(\.[\w.]+)\s*\|\s*nindent\s+(\d+)\s*\}\}", nindent, template)

    def value(match):
        v = lookup(context, match.group(1))
        return json.dumps(v) if isinstance(v, bool) else str(v)

    text = re.sub(r"\{\{\s*(\.[\w.]+)\s*\}\}", value, text)
    assert "{{" not in text, f"a template form the test's renderer does not know: {text[text.index('{{'):][:80]}"
    return text


def rendered_chart(namespace="shardfs"):
    context = {
        "Values": yaml.safe_load((CHART / "values.yaml").read_text()),
        "Release": {"Namespace": namespace, "Name": "shardfs-csi", "Service": "Helm"},
        "Chart": {"Version": yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]},
    }
    docs = []
    for path in sorted((CHART / "templates").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(render(path.read_text(), context)) if d is not None]
    return docs


def one(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def check_node_plugin(docs, namespace):
    """The fields kubelet and the sidecars read, in the CSIDriver, ServiceAccount and DaemonSet."""
    driver = one(docs, "CSIDriver")
    assert driver["apiVersion"] == "storage.k8s.io/v1"
    assert driver["metadata"]["name"] == DRIVER
    spec = driver["spec"]
    assert spec["attachRequired"] is False, "no controller publishes: kubelet must not wait for an attach"
    assert spec["podInfoOnMount"] is False
    assert spec["volumeLifecycleModes"] == ["Persistent"]
    assert spec["fsGroupPolicy"] == "None", "kubelet would chown every chunk file"

    account = one(docs, "ServiceAccount")
    daemonset = one(docs, "DaemonSet")
    assert daemonset["apiVersion"] == "apps/v1"
    assert daemonset["metadata"]["namespace"] == account["metadata"]["namespace"] == namespace
    assert daemonset["spec"]["selector"]["matchLabels"].items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    containers = {c["name"]: c for c in pod["containers"]}
    plugin, registrar = containers["shardfs-csi"], containers["node-driver-registrar"]

    def mounts(container):
        return {m["name"]: m for m in container["volumeMounts"]}

    def flag(container, name):
        values = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"--{name}=")]
        assert len(values) == 1, f"{container['name']}: --{name} {values}"
        return values[0]

    # The plugin: `shardfs csi` on a socket in its plugin directory, named by the node's name.
    assert plugin["args"][0] == "csi"
    endpoint = flag(plugin, "endpoint")
    assert endpoint.startswith("unix:///")
    socket = Path(endpoint[len("unix://"):])
    assert flag(plugin, "node-id") == "$(NODE_NAME)"
    node_name = {e["name"]: e for e in plugin["env"]}["NODE_NAME"]
    assert node_name["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert plugin["securityContext"]["privileged"] is True
    plugin_dir = mounts(plugin)["plugin-dir"]
    assert socket.parent == Path(plugin_dir["mountPath"])
    host_plugin_dir = Path(volumes["plugin-dir"]["hostPath"]["path"])
    kubelet = Path(volumes["kubelet-dir"]["hostPath"]["path"])
    assert kubelet == Path("/var/lib/kubelet")
    assert host_plugin_dir == kubelet / "plugins" / DRIVER
    # Pods' target paths are below kubelet's directory, seen at the same path in the container,
    # and the daemons' mounts there must reach the node: Bidirectional.
    kubelet_mount = mounts(plugin)["kubelet-dir"]
    assert Path(kubelet_mount["mountPath"]) == kubelet
    assert kubelet_mount["mountPropagation"] == "Bidirectional"
    assert volumes["kubelet-dir"]["hostPath"]["type"] == "Directory"
    assert volumes["fuse-device"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert mounts(plugin)["fuse-device"]["mountPath"] == "/dev/fuse"

    # The registrar dials the same socket, and tells kubelet where it is on the node.
    assert Path(mounts(registrar)["plugin-dir"]["mountPath"]) / socket.name == Path(flag(registrar, "csi-address"))
    assert Path(flag(registrar, "kubelet-registration-path")) == host_plugin_dir / socket.name
    assert mounts(registrar)["registration-dir"]["mountPath"] == "/registration"
    assert Path(volumes["registration-dir"]["hostPath"]["path"]) == kubelet / "plugins_registry"
    assert "mountPropagation" not in mounts(registrar)["plugin-dir"]
    assert "csi-node-driver-registrar" in registrar["image"]


def mount_flags():
    """The long flags of `shardfs mount`, from the binary's help."""
    out = subprocess.run([BINARY, "mount", "--help"], check=True, capture_output=True, text=True).stdout
    return set(re.findall(r"--([a-z][a-z-]*)", out))


def test_the_manifests_agree_with_each_other_and_the_driver():
    docs = manifests()
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), doc
    check_node_plugin([d for d in docs if d["kind"] in ("CSIDriver", "ServiceAccount", "DaemonSet")], "kube-system")


def test_the_example_volume_is_one_the_driver_takes():
    docs = manifests()
    volume, claim, secret = one(docs, "PersistentVolume"), one(docs, "PersistentVolumeClaim"), one(docs, "Secret")
    csi = volume["spec"]["csi"]
    assert csi["driver"] == DRIVER
    assert set(csi["volumeAttributes"]) == {"store"}
    assert re.match(r"^[a-z0-9]+://|^/", csi["volumeAttributes"]["store"])
    assert csi["nodePublishSecretRef"] == {"name": secret["metadata"]["name"],
                                           "namespace": secret["metadata"]["namespace"]}
    for key in secret["stringData"]:
        assert SECRET_KEY.match(key), f"the driver refuses secret key {key}"
    flags = mount_flags()
    for option in volume["spec"]["mountOptions"]:
        name = option.lstrip("-").split("=", 1)[0].split(" ", 1)[0].replace("_", "-")
        assert name in flags, f"mountOptions: {option} is no flag of shardfs mount"
    # Bound to each other statically: no storage class provisions either.
    assert volume["spec"]["storageClassName"] == claim["spec"]["storageClassName"] == ""
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert volume["spec"]["claimRef"] == {"namespace": claim["metadata"]["namespace"], "name": claim["metadata"]["name"]}
    assert set(claim["spec"]["accessModes"]) <= set(volume["spec"]["accessModes"])


def test_the_chart_renders_the_same_node_plugin():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "shardfs-csi"
    docs = rendered_chart("shardfs")
    check_node_plugin(docs, "shardfs")
    # The chart's image is the one the plain DaemonSet names.
    plain = one(manifests(), "DaemonSet")["spec"]["template"]["spec"]["containers"]
    rendered = one(docs, "DaemonSet")["spec"]["template"]["spec"]["containers"]
    assert [c["image"] for c in plain] == [c["image"] for c in rendered]
    assert [c["args"] for c in plain] == [c["args"] for c in rendered]


def test_the_renderer_fails_on_what_it_does_not_know():
    with pytest.raises(AssertionError):
        render("a: {{ include \"x\" . }}", {})
    assert render("a: {{ .Values.b }}\nc:\n  {{- toYaml .Values.d | nindent 2 }}", {"Values": {"b": True, "d": {"e": 1}}}) \
        == "a: true\nc:\n  e: 1"


@pytest.mark.skipif(shutil.which("helm") is None, reason="no helm binary (no registry here offers one)")
def test_helm_renders_the_chart_as_checked():
    out = subprocess.run(["helm", "template", "shardfs-csi", str(CHART), "--namespace", "shardfs"],
                         check=True, capture_output=True, text=True).stdout
    check_node_plugin([d for d in yaml.safe_load_all(out) if d], "shardfs")


def test_the_containerfile_runs_the_driver_under_an_init():
    text = (ROOT / "Containerfile").read_text()
    assert "COPY target/release/shardfs /usr/bin/shardfs" in text
    assert re.search(r'ENTRYPOINT \["/usr/bin/tini", "--", "/usr/bin/shardfs"\]', text)
    assert re.search(r"apt-get install .*fuse3", text)
