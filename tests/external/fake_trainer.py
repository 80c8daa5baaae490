#!/usr/bin/python3
"""A stand-in trainer for tests/verify/test_external.cpp: standard library only (starts in ~30 ms), a
deterministic "training" of one float64 vector driven by a random.Random stream, checkpoints as
hand-written safetensors files. Switches make it misbehave the ways the external check must
handle: a resume bug, nondeterminism, a crash, a hang, a flood of output, garbage in its log, a
hostile legacy torch file (garbage_legacy_torch: torch's own loader would append a .patch file to
OUT/../../../pwned_<iters>.patch, outside the tool's run directory; tests/conformance/hostile_torch.py).
Two modes are for tests/verify/test_lifetime.cpp: `daemons` starts a setsid() worker and a
double-forked daemon, writes their pids (and its own) to $RH_TEST_PIDS_DIR/<what>-<trainer pid>.pid and sleeps;
`fifo_torch` writes its final torch checkpoint as a legacy (tar) torch.save file whose `storages`
member is a FIFO: torch 1.13's reader extracts it and blocks in open() (issue 41, item 8).
--plant WHAT --plant-to DIR: when it ends, replaces a directory of its cell with a symbolic link to
DIR, as a hostile trainer would between the tool's checks and its writes: "cell" (its cell
directory, from the interrupted run), "interrupted" (that run's directory, from the round trip),
"flat" (the torch conversions' directory, from the round trip). --sparse-mib M: the interrupted
run leaves a sparse file of M MiB (two bytes of data) in its save directory.

  fake_trainer.py --iters N --save-every K --out DIR [--load DIR] [--mode MODE] [--plant WHAT --plant-to DIR]
"""
import argparse, json, os, random, struct, sys, time

MODES = ["ok", "rng_not_saved", "nondeterministic", "crash_interrupted", "hang", "spam", "bad_iteration",
         "iters_dependent", "no_checkpoint", "garbage_checkpoint", "garbage_torch", "garbage_legacy_torch", "csv",
         "jsonl", "daemons", "fifo_torch"]


def save(path, w, it, rng_state, with_rng):
    meta = {"iteration": str(it)}
    if with_rng:
        meta["rng"] = json.dumps(rng_state)
    data = struct.pack("<%dd" % len(w), *w)
    header = {"__metadata__": meta, "w": {"dtype": "F64", "shape": [len(w)], "data_offsets": [0, len(data)]}}
    h = json.dumps(header, sort_keys=True).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    os.replace(tmp, path)


def load(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8:8 + n])
    w = list(struct.unpack("<%dd" % header["w"]["shape"][0], b[8 + n:]))
    meta = header["__metadata__"]
    rng = meta.get("rng")
    return w, int(meta["iteration"]), (json.loads(rng) if rng else None)


def fifo_tar(path):
    import io, tarfile
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT, encoding="latin-1") as tar:
        data = b"run %d" % os.getpid()   # different bytes per run: the files are compared, not skipped
        first = tarfile.TarInfo("\x80\x02pickle")   # the file starts with a pickle protocol header
        first.size = len(data)
        tar.addfile(first, io.BytesIO(data))
        fifo = tarfile.TarInfo("storages")
        fifo.type = tarfile.FIFOTYPE
        tar.addfile(fifo)


def write_pid(name):
    d = os.environ["RH_TEST_PIDS_DIR"]
    tmp = os.path.join(d, name + ".tmp%d" % os.getpid())
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, os.path.join(d, name + ".pid"))


def start_daemons():
    tag = "-%d" % os.getpid()
    write_pid("trainer" + tag)
    if os.fork() == 0:   # a worker in a session of its own
        os.setsid()
        write_pid("worker" + tag)
        time.sleep(3600)
        os._exit(0)
    middle = os.fork()
    if middle == 0:      # a daemon: setsid, fork again, the middle exits (its parent is no longer us)
        os.setsid()
        if os.fork() == 0:
            write_pid("daemon" + tag)
            time.sleep(3600)
        os._exit(0)
    os.waitpid(middle, 0)
    time.sleep(3600)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, required=True)
    p.add_argument("--save-every", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--load")
    p.add_argument("--mode", default="ok", choices=MODES)
    p.add_argument("--plant", choices=["cell", "interrupted", "flat"])
    p.add_argument("--plant-to")
    p.add_argument("--sparse-mib", type=int, default=0, help="the interrupted run leaves a sparse file this big")
    a = p.parse_args()
    rng = random.Random(os.urandom(8) if a.mode == "nondeterministic" else 1234)
    w, start = [0.5, -0.25, 1.0], 0
    if a.load:
        ckpts = sorted((int(f[5:-12]), f) for f in os.listdir(a.load) if f.startswith("iter_") and f.endswith(".safetensors"))
        w, start, state = load(os.path.join(a.load, ckpts[-1][1]))
        if state is not None:
            rng.setstate((state[0], tuple(state[1]), state[2]))
    if a.mode == "crash_interrupted" and a.iters < 20:
        print("boom", file=sys.stderr)
        sys.exit(3)
    if a.mode == "hang":
        time.sleep(3600)
    if a.mode == "daemons":
        start_daemons()
    os.makedirs(a.out, exist_ok=True)
    out = open(os.path.join(a.out, "..", "metrics." + a.mode), "w") if a.mode in ("csv", "jsonl") else None
    if a.mode == "csv":
        out.write("iteration,loss\n")
    for it in range(start + 1, a.iters + 1):
        lr = 0.1 / a.iters if a.mode == "iters_dependent" else 0.005
        w = [x - lr * (x + rng.gauss(0, 1)) for x in w]
        loss = sum(x * x for x in w)
        if a.mode == "spam":
            sys.stdout.write("x" * 1000000 + "\n")
        if a.mode == "bad_iteration" and it == 3:
            print("iter 99999999999999999999999: loss 1.0")
        print("iter %d: loss %.6f" % (it, loss), flush=True)
        if out is not None:
            out.write("%d,%r\n" % (it, loss) if a.mode == "csv" else json.dumps({"iteration": it, "loss": loss}) + "\n")
        if (it % a.save_every == 0 or it == a.iters) and a.mode != "no_checkpoint":
            path = os.path.join(a.out, "iter_%d.safetensors" % it)
            if a.mode == "fifo_torch":
                fifo_tar(os.path.join(a.out, "iter_%d.pt" % it))
                save(path, w, it, rng.getstate(), True)
            elif a.mode == "garbage_torch":   # not a torch.save file, different bytes per run length
                open(os.path.join(a.out, "iter_%d.pt" % it), "wb").write(b"garbage %d" % a.iters)
            elif a.mode == "garbage_legacy_torch":
                sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "conformance"))
                import hostile_torch
                target = os.path.abspath(os.path.join(a.out, "..", "..", "..", "pwned_%d" % a.iters))
                open(os.path.join(a.out, "iter_%d.pt" % it), "wb").write(hostile_torch.legacy_dump_patches(target))
            elif a.mode == "garbage_checkpoint" and a.iters < 20:   # only the interrupted run's
                open(path, "wb").write(b"\x00" * 12)
            else:
                save(path, w, it, rng.getstate(), a.mode != "rng_not_saved")
    if a.iters == start:   # nothing trained after a load: the round trip re-saves what it loaded
        save(os.path.join(a.out, "iter_%d.safetensors" % start), w, start, rng.getstate(), a.mode != "rng_not_saved")
    if a.sparse_mib and not a.load and a.iters < 20:   # a hole of that size with one byte of data at each end
        with open(os.path.join(a.out, "sparse.bin"), "wb") as f:
            f.write(b"a")
            f.seek(a.sparse_mib * 1024 * 1024 - 1)
            f.write(b"z")
    plant(a)


def plant(a):
    """Swaps a directory of the cell (<cell>/<run>/save is --out) for a link to --plant-to."""
    if not a.plant:
        return
    cell = os.path.dirname(os.path.dirname(os.path.abspath(a.out)))
    if a.plant == "cell" and not a.load and a.iters < 20:   # the interrupted run
        victim = cell
    elif a.plant in ("interrupted", "flat") and a.load and a.iters < 20:   # the round trip
        victim = os.path.join(cell, a.plant)
    else:
        return
    if os.path.lexists(victim):
        os.rename(victim, victim + ".moved")
    os.symlink(a.plant_to, victim)


if __name__ == "__main__":
    main()
