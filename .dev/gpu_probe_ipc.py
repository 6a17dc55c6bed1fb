"""Whether CUDA IPC (torch's reduce_tensor: cudaIpcGetMemHandle/OpenMemHandle) works between processes in different
PID, IPC and user namespaces, both ways. Run as root on a GPU host: python3 .dev/gpu_probe_ipc.py"""
import base64, json, os, pickle, subprocess, sys, tempfile

EXPORT = r"""
import base64, pickle, sys, torch
from torch.multiprocessing.reductions import reduce_tensor
t = torch.full((1 << 20,), 7.0, device="cuda")
fn, args = reduce_tensor(t)
sys.stdout.write(base64.b64encode(pickle.dumps((fn, args))).decode() + "\n"); sys.stdout.flush()
sys.stdin.readline()
"""
IMPORT = r"""
import base64, pickle, sys, torch
torch.cuda.init(); torch.zeros(1, device="cuda")
fn, args = pickle.loads(base64.b64decode(open(sys.argv[1]).read()))
try:
    t = fn(*args); print("OK", float(t.sum()))
except Exception as exc:
    print("FAIL", type(exc).__name__, str(exc)[:200])
"""
USER = ["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups"]
PREFIX = {
    "plain": [],
    "pidns": ["unshare", "--pid", "--fork", "--mount-proc"],
    "pidns+ipcns": ["unshare", "--pid", "--ipc", "--fork", "--mount-proc"],
    "uid1001": USER,
    "uid1001 userns+pidns+ipc+net": USER + ["unshare", "--user", "--map-current-user", "--pid", "--ipc", "--net",
                                              "--fork"],
}


def case(exporter: str, importer: str) -> str:
    ex = subprocess.Popen(PREFIX[exporter] + [sys.executable, "-c", EXPORT], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/tmp")
    line = ex.stdout.readline()
    if not line:
        return "exporter failed: " + ex.stderr.read()[-300:]
    with tempfile.NamedTemporaryFile("w", delete=False, dir="/tmp", suffix=".b64") as f:
        f.write(line)
    os.chmod(f.name, 0o644)
    try:
        out = subprocess.run(PREFIX[importer] + [sys.executable, "-c", IMPORT, f.name], capture_output=True,
                             text=True, timeout=120, cwd="/tmp")
        answer = (out.stdout.strip().splitlines() or ["no output: " + out.stderr[-300:]])[-1]
    finally:
        ex.stdin.write("\n"); ex.stdin.close(); ex.wait(30)
    return answer


rows = {}
for exporter, importer in [("plain", "plain"), ("plain", "pidns"), ("pidns", "plain"), ("pidns", "pidns"),
                           ("plain", "pidns+ipcns"), ("pidns+ipcns", "plain"), ("plain", "uid1001"),
                           ("plain", "uid1001 userns+pidns+ipc+net"), ("uid1001 userns+pidns+ipc+net", "plain"),
                           ("uid1001 userns+pidns+ipc+net", "uid1001 userns+pidns+ipc+net")]:
    rows[f"{exporter} -> {importer}"] = case(exporter, importer)
    print(f"{exporter:32s} -> {importer:32s} {rows[f'{exporter} -> {importer}']}", flush=True)
out = os.environ.get("OUT")
if out:
    with open(os.path.join(out, "ipc_namespaces.json"), "w") as f:
        json.dump(rows, f, indent=1)
