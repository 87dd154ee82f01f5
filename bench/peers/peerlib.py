"""What the DeepSpeed benches (equivalence.py, speed.py) share: the peer's environment, the
header, the initial checkpoint, and launching `troupe train` and DeepSpeed's train_ds.py."""
import argparse
import json
import os
import re
import signal
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TROUPE_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")


def one_line(text, limit=160):
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def peer_python():
    """(python of bench/peers/setup.sh's environment, None) or (None, why it cannot be had,
    setup.sh's exit status: 3 when there is no network)."""
    p = subprocess.run([os.path.join(HERE, "setup.sh"), "--python"], capture_output=True, text=True)
    if p.returncode == 0:
        return p.stdout.strip().splitlines()[-1], None, 0
    why = [l for l in p.stderr.splitlines() if l.startswith("peers: skipped: ")]
    return None, (why[-1][len("peers: skipped: "):] if why else one_line(p.stderr or "setup.sh failed")), p.returncode


def header(py, model):
    """The machine, the date, the peer's versions (py None: no peer) and the model line."""
    lscpu = subprocess.run("lscpu | sed -n 's/^Model name: *//p'", shell=True, capture_output=True, text=True)
    print("machine: %s, %d CPUs" % (one_line(lscpu.stdout), os.cpu_count()))
    print("date: %s" % time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print("load_average_at_start: %.2f %.2f %.2f" % os.getloadavg())
    if py:
        ver = subprocess.run([py, "-c", "import torch, deepspeed; print(torch.__version__, deepspeed.__version__)"],
                             capture_output=True, text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
        print("peer: DeepSpeed %s on PyTorch %s, CPU accelerator (gloo), launched by `deepspeed"
              " --num_accelerators N`" % tuple(reversed(ver.stdout.split()[:2] or ["?", "?"])))
    print("model: " + model)


def write_init(build, work, cfg, dims, data):
    """Troupe writes the llm.c checkpoint both sides start from (`troupe train --steps 0
    --export-llmc`) with the config cfg and the model flags dims; its path, or raises
    RuntimeError with troupe's error in one line."""
    init, cfg_path = os.path.join(work, "init.bin"), os.path.join(work, "init.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    p = subprocess.run([os.path.join(build, "troupe"), "train", "--deepspeed_config", cfg_path, *dims,
                        "--train-data", data, "--steps", "0", "--val-batches", "1", "--export-llmc", init],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("troupe cannot write the initial checkpoint: " + one_line(p.stderr))
    return init


def run(cmd, env, timeout):
    """cmd's finished process; past timeout seconds its whole process group (the launcher and
    its ranks) is killed and the process ends with status 124 and a TimeoutError line. An
    interrupt (Ctrl-C, which the group in its own session does not see) kills the group too
    before it goes on up."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, p.returncode, out, err)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return subprocess.CompletedProcess(cmd, 124, out, err + "\nTimeoutError: killed after %d s" % timeout)
    except BaseException:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()  # the pipes close when every process of the group has exited
        raise


def mpirun(ranks, bind):
    """The launcher prefix for `troupe train` on ranks ranks. bind false: unbound (the
    equivalence runs); true: bench/dp/run.sh's placement, cores / ranks cores each (one rank:
    unbound, every core; more ranks than cores: bound, oversubscribed)."""
    if not bind:
        return [] if ranks == 1 else ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"]
    if ranks == 1:
        return ["mpirun", "-np", "1", "--bind-to", "none"]
    if ranks <= (os.cpu_count() or 1):
        return ["mpirun", "-np", str(ranks), "--map-by", "core", "--bind-to", "core"]
    return ["mpirun", "--oversubscribe", "-np", str(ranks), "--map-by", "core", "--bind-to", "core:overload-allowed"]


def run_troupe(build, ranks, cfg_path, args, bind=False, wrap=(), timeout=600):
    """`troupe train --deepspeed_config cfg_path ARGS` on ranks ranks (wrap: a command each
    rank runs troupe under, e.g. /usr/bin/time); the finished process."""
    cmd = mpirun(ranks, bind) + list(wrap) + [os.path.join(build, "troupe"), "train", "--deepspeed_config",
                                               cfg_path, *args]
    return run(cmd, TROUPE_ENV, timeout)


SHM_DIR = "/dev/shm"


def shm_buffers(port):
    """{path: mtime_ns} of the shared-memory files DeepSpeed's CPU collectives make for a run
    whose launcher had master port `port`: ops/csrc/cpu/comm/shm.cpp's
    deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>, one per rank (67 MB
    each), created when all ranks are local and never unlinked by DeepSpeed."""
    name = re.compile(r"deepspeed_allreduce_buffer_%d_[^_/]+_%d_[0-9]+\Z" % (os.getuid(), port))
    found = {}
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return found
    for n in names:
        if name.match(n):
            try:
                found[os.path.join(SHM_DIR, n)] = os.stat(os.path.join(SHM_DIR, n)).st_mtime_ns
            except OSError:
                pass
    return found


def shm_mapped():
    """The /dev/shm files some live process maps (its /proc/PID/maps; those this user cannot
    read are another user's, whose buffers carry another uid)."""
    mapped = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/maps" % pid) as f:
                for line in f:
                    i = line.find(SHM_DIR + "/")
                    if i >= 0:
                        mapped.add(line[i:].rstrip("\n"))
        except OSError:
            pass
    return mapped


def remove_shm_buffers(port, before):
    """Removes the DeepSpeed buffers of the run on `port` that has ended: those it made or
    wrote (absent from `before`, shm_buffers' answer taken before the launch, or written
    since) and that no live process maps (a run of someone else's on the same port). Returns
    the paths removed."""
    mapped, removed = shm_mapped(), []
    for path, mtime in shm_buffers(port).items():
        if before.get(path) == mtime or path in mapped:
            continue
        try:
            os.unlink(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def run_deepspeed(py, ranks, port, args, launcher=(), timeout=1200):
    """bench/peers/deepspeed/train_ds.py ARGS under `deepspeed --num_accelerators ranks` on
    the CPU accelerator (launcher: more launcher options); the finished process. The
    shared-memory buffers the run leaves in /dev/shm are removed when it ends, however it
    ends (DeepSpeed never unlinks them: 67 MB of RAM per rank and run)."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", PATH=os.path.dirname(py) + os.pathsep + os.environ.get("PATH", ""))
    cmd = [os.path.join(os.path.dirname(py), "deepspeed"), "--num_accelerators", str(ranks),
           "--master_port", str(port), *launcher, os.path.join(HERE, "deepspeed", "train_ds.py"), *args]
    before = shm_buffers(port)
    try:
        return run(cmd, env, timeout)
    finally:
        remove_shm_buffers(port, before)


def last_error(p):
    """One line saying why a failed run failed: train_ds.py's `ds_error:` line, else the last
    line naming an error, else its last line or its exit status."""
    mine = [l[len("ds_error: "):] for l in p.stdout.splitlines() if l.startswith("ds_error: ")]
    lines = [l for l in (p.stderr + p.stdout).splitlines() if l.strip()]
    errs = [l for l in lines if "Error" in l or "error" in l]
    return one_line((mine or errs or lines or ["exit %d" % p.returncode])[-1])


def arguments(doc, steps):
    """The options both tables take (BUILD_DIR, --steps, --only, --list, --keep); a table adds
    its own to the parser returned."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("build")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--only", default="", help="comma-separated row names")
    ap.add_argument("--list", action="store_true", help="print the row names and exit")
    ap.add_argument("--keep", action="store_true", help="keep the work folder and print it")
    return ap


def chosen(args, rows):
    """The rows --only names (all without it); None after --list printed every name."""
    if args.list:
        print("\n".join(c["name"] for c in rows))
        return None
    names = args.only.split(",") if args.only else None
    return [c for c in rows if names is None or c["name"] in names]
