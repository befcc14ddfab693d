"""What a checkpoint in an object store costs the training loop: S3 (moto's server on localhost, s3fs the client) against a
local folder, each synchronous and asynchronous.

    python bench/bench_store.py [--width 1024] [--every 5] [--fits 5]     # needs `pip install fastxtend_accel[s3] moto[server]`

The same fit five ways, alternating in a new order each round: without checkpoints, and with
`CheckpointCallback(every_steps=...)` into a local folder and into `s3://bench/...`, each with `async_save` off and on. The
stall is the time the training loop spends in the callback's `after_batch` (sync: the whole write or upload; async: copying
the tensors, waiting for the previous write), shown per checkpoint; the wait at the end of the fit, for the last checkpoint's
write, is shown apart. A ratio is the median over rounds of each round's
ratio. The server runs in its own process on this machine: the upload time measured here is this machine's loopback, not a
cloud's network; what it shows is how much of an upload the training loop waits for."""
import argparse, json, os, random, shutil, socket, subprocess, sys, tempfile, time, torch
from pathlib import Path
from fastai.basics import *
from fastxtend_accel.core import *
from fastxtend_accel.checkpoint import CheckpointCallback

p = argparse.ArgumentParser()
p.add_argument('--width', type=int, default=1024, help='hidden width of the MLP (1024: 1.3M parameters, checkpoints of 16 MB with Adam)')
p.add_argument('--every', type=int, default=20, help='checkpoint every this many optimizer steps (further apart than an upload takes)')
p.add_argument('--epochs', type=int, default=3)
p.add_argument('--fits', type=int, default=5, help='alternating rounds (each mode once a round)')
args = p.parse_args()

def s3_server():
    "moto's S3 server in a process of its own, on a free port; this process's S3 clients pointed at it"
    with socket.socket() as s: s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, '-m', 'moto.server', '-H', '127.0.0.1', '-p', str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.environ.update(AWS_ENDPOINT_URL=f'http://127.0.0.1:{port}', AWS_ACCESS_KEY_ID='bench', AWS_SECRET_ACCESS_KEY='bench',
                      AWS_DEFAULT_REGION='us-east-1')
    for _ in range(600):
        try: socket.create_connection(('127.0.0.1', port), timeout=1).close(); break
        except OSError: time.sleep(0.1)
    import s3fs
    s3fs.S3FileSystem().mkdir('s3://bench')
    return proc

stall = [0., 0.] # in the training loop (`after_batch`), at the end of the fit (`after_fit`: waiting for the last write)
def timed(f, i):
    def _inner(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: stall[i] += time.perf_counter() - t
    return _inner
CheckpointCallback.after_batch,CheckpointCallback.after_fit = timed(CheckpointCallback.after_batch, 0),timed(CheckpointCallback.after_fit, 1)

def learner():
    set_seed(0)
    x,y = torch.randn(2048, 256),torch.randint(0, 10, (2048,))
    dsets = Datasets(range(2048), [[x.__getitem__], [y.__getitem__]], splits=[list(range(1792)), list(range(1792, 2048))])
    w = args.width
    model = nn.Sequential(nn.Linear(256, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10))
    return Learner(dsets.dataloaders(bs=64, device='cpu'), model, loss_func=nn.CrossEntropyLoss()).accelerate()

def fit(mode, where):
    learn = learner()
    path = f's3://bench/{mode}-{time.time_ns()}' if where == 's3' else Path(tmp)/f'{mode}-{time.time_ns()}'
    cbs = [] if mode == 'none' else [CheckpointCallback(path, every_steps=args.every, every_epochs=None, keep=1, async_save=mode == 'async')]
    stall[:] = [0., 0.]
    t = time.perf_counter()
    with learn.no_bar(), learn.no_logging(): learn.fit(args.epochs, 1e-3, cbs=cbs)
    n = learn.train_iter//args.every
    return dict(stall_ms_per_ckpt=1e3*stall[0]/max(n, 1), end_wait_ms=1e3*stall[1], fit_s=time.perf_counter() - t, ckpts=n,
                MB=3*4*sum(p.numel() for p in learn.model.parameters())/1e6)

server,tmp = s3_server(),tempfile.mkdtemp()
try:
    torch.set_num_threads(1)
    fit('none', 'local') # warm-up
    modes,runs,order = [('none', 'local'), ('sync', 'local'), ('sync', 's3'), ('async', 'local'), ('async', 's3')],{},random.Random(0)
    for _ in range(args.fits):
        for m in order.sample(modes, len(modes)): runs.setdefault(m, []).append(fit(*m))
finally: server.terminate(); shutil.rmtree(tmp, ignore_errors=True)
def median(xs): return sorted(xs)[len(xs)//2]
def ratio(a, b, k='stall_ms_per_ckpt'): return median([x[k]/y[k] for x,y in zip(runs[a], runs[b])])
for m,rs in runs.items():
    print(json.dumps(dict(mode=m[0], store=m[1], **{k: round(median([r[k] for r in rs]), 2) for k in rs[0]})))
mb,n = runs['sync', 'local'][0]['MB'],runs['sync', 'local'][0]['ckpts']
print(f"\n{args.fits} rounds, {n} checkpoints of {mb:.1f} MB per fit, medians in ms: the training loop's stall per checkpoint,"
      " and the wait at the end of the fit for the last write\n")
print('| | local folder | S3 (localhost) | S3 / local |\n|---|---|---|---|')
for mode in ('sync', 'async'):
    for k,what in (('stall_ms_per_ckpt', 'stall per checkpoint'), ('end_wait_ms', 'wait at the end of the fit')):
        print(f"| {mode}: {what} | {median([r[k] for r in runs[mode, 'local']]):.1f} | {median([r[k] for r in runs[mode, 's3']]):.1f} | "
              f"{ratio((mode, 's3'), (mode, 'local'), k):.2f}x |")
print(f"| fit (s), no checkpoints: {median([r['fit_s'] for r in runs['none', 'local']]):.2f} | "
      f"{median([r['fit_s'] for r in runs['async', 'local']]):.2f} async | {median([r['fit_s'] for r in runs['async', 's3']]):.2f} async | |")
r = ratio(('async', 's3'), ('async', 'local'))
print(f"\ntarget: the training loop's stall per asynchronous checkpoint, S3 / local <= 1.10: {r:.2f}x -> {'PASS' if r <= 1.10 else 'FAIL'}")
