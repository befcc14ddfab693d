"""Checkpoints in an object store: moto's S3 server on localhost (s3fs the client, as in s3fs's own tests), reached through a
link that can fail (tests/store_server.py), and fsspec's `memory://`. Resumed on a fresh machine and on another number of
processes, FSDP2 shards, uploads in the background, and the faults a store has."""
import os, signal, subprocess, sys, threading, warnings
import numpy as np, pytest, torch
from fastai.basics import Callback, defaults, set_seed
from fastxtend_accel.core import * # `Learner.accelerate`
from fastxtend_accel.checkpoint import CheckpointCallback, latest_checkpoint, checkpoint_to_weights, scan_checkpoints
from fastxtend_accel.checkpoint.checksums import verify_checkpoint, manifest_name
from fastxtend_accel.checkpoint.stores import StorePath
from fastxtend_accel.test_utils import synth_learner_digits, StopAt, torchrun_cmd, run_cmd, start_cmd, wait_for, kill_group, \
    signal_proc
from conftest import SCRIPTS
from store_server import S3Server
from test_dcp import RESUME, DCP_FILES, launch, results, close, _one_process_fit, _same_state

@pytest.fixture(scope='module')
def s3():
    "moto's S3 server with a bucket `ckpts`; this process and the ones it starts reach it through `s3.link`"
    import s3fs
    server = S3Server()
    old = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem().mkdir('s3://ckpts')
    yield server
    server.stop()
    for k,v in old.items():
        if v is None: os.environ.pop(k, None)
        else: os.environ[k] = v
    s3fs.S3FileSystem.clear_instance_cache()

@pytest.fixture(scope='module')
def reference():
    "The fit dcp_resume.py runs, uninterrupted, in this process"
    learn = _one_process_fit(64)
    return [p.detach() for p in learn.model.parameters()], learn.recorder.values, list(learn.ema.avg.values())

def progress(out, tag): return tuple(map(int, (out/f'progress-{tag}').read_text().split()))

def test_sigterm_on_two_processes_then_a_fresh_machine(s3, tmp_path_factory, reference):
    """2 processes saving in the background to S3, SIGTERM to torchrun mid-epoch: the checkpoint taken on the signal is uploaded
    before they exit. A new process with an empty folder, given only the URL, resumes: the fit of one uninterrupted process"""
    url,a,b = 's3://ckpts/term',tmp_path_factory.mktemp('machine-a'),tmp_path_factory.mktemp('machine-b')
    proc = start_cmd(torchrun_cmd(2) + [RESUME, a, '--ckpt', url, '--tag', 'a', '--async-save', '--sleep', '0.05'])
    wait_for(lambda: (a/'progress-a').exists() and progress(a, 'a') >= (1, 3), proc)
    signal_proc(proc, signal.SIGTERM, timeout=120)
    out = proc.stdout.read().decode()
    assert not (a/'a-rank0.pt').exists(), out[-2000:]
    ck = latest_checkpoint(url)
    assert isinstance(ck, StorePath) and ck.name.startswith('ckpt-e0001-') and '-b000000-' not in ck.name, out[-2000:]
    # each process uploaded its own files; the manifest, written last, lists them all
    assert sorted(p.name for p in ck.iterdir()) == DCP_FILES and sorted(verify_checkpoint(ck)) == sorted(set(DCP_FILES) - {manifest_name})
    assert not scan_checkpoints(url)[1] # the background upload in flight at the signal was finished first
    out = launch(1, b, '--ckpt', url, '--tag', 'b')
    assert f'Resuming from {ck}' in out and 'written by 2 process(es), now 1' in out
    res = results(b, 'b', 1)[0]
    assert res['resumed_from'] == ck.name
    close(res['params'], reference[0]); close(res['ema'], reference[2])
    np.testing.assert_allclose(res['values'], reference[1], atol=1e-6)
    assert sorted(os.listdir(b)) == ['b-rank0.pt', 'history-b.csv', 'models', 'prepared-b-node0', 'progress-b'] # nothing local

def test_sigkill_mid_upload_then_two_processes_elsewhere(s3, tmp_path_factory, reference):
    """One process uploading in the background, SIGKILLed while the store holds the upload of a checkpoint's tensor file: the
    checkpoint before stays the newest. Resumed from the URL by 2 processes in another empty folder (`split_batches=True`):
    exact, and the half-uploaded checkpoint is written anew"""
    url,a,b = 's3://ckpts/kill',tmp_path_factory.mktemp('machine-a'),tmp_path_factory.mktemp('machine-b')
    held = 'ckpt-e0001-b000004-f000' # 17 batches an epoch, a checkpoint every 3 steps: the 21st step's
    s3.link.stall_during(f'{held}/__0_0.distcp'.encode())
    proc = start_cmd([sys.executable, RESUME, a, '--ckpt', url, '--tag', 'a', '--async-save'])
    half = lambda: [p.name for p in scan_checkpoints(url)[1]]
    wait_for(lambda: half() == [held], proc) # its small files are there, its tensors held
    kill_group(proc)
    s3.link.cut(); s3.link.mend() # the held request dies with the process
    ck = latest_checkpoint(url)
    assert ck.name == 'ckpt-e0001-b000001-f000' and half() == [held]
    launch(2, b, '--ckpt', url, '--tag', 'b')
    res = results(b, 'b', 2)
    assert [r['resumed_from'] for r in res] == [ck.name]*2
    for r in res: close(r['params'], reference[0]); close(r['ema'], reference[2])
    np.testing.assert_allclose(res[0]['values'], reference[1], atol=1e-6)
    assert not scan_checkpoints(url)[1] # the held one written whole by the resumed run, or pruned

def test_fsdp2_shards_straight_to_the_store(s3, tmp_path):
    """FSDP2 on 2 processes: each uploads its own shards; the checkpoint loads from the URL into one plain process, and as one
    file (`checkpoint_to_weights`, itself written to the store) into a plain fastai `Learner`"""
    url = 's3://ckpts/fsdp'
    run_cmd(torchrun_cmd(2) + [SCRIPTS/'dcp_fsdp.py', tmp_path, '--ckpt', url, '--tag', 'a', '--stop', '0,8'], check=False)
    saved = torch.load(tmp_path/'a-full.pt')
    ck = latest_checkpoint(url)
    assert ck.name == 'ckpt-e0000-b000009-f000' and sorted(p.name for p in ck.iterdir()) == DCP_FILES
    learn = synth_learner_digits(n=768, bs=36, hidden=50)
    learn.load_state(str(ck))
    _same_state(learn, saved)
    weights = checkpoint_to_weights(str(ck), 's3://ckpts/fsdp-weights/model.pth')
    (tmp_path/'models').mkdir()
    (tmp_path/'models'/'model.pth').write_bytes(weights.read_bytes())
    plain = synth_learner_digits(n=768, bs=36, hidden=50, seed=1, path=tmp_path)
    plain.load('model')
    _same_state(plain, saved)

def _fit(cbs=(), n_epoch=2, **kwargs):
    "A small fit in this process: the same batches and values on every call"
    learn = synth_learner_digits(n=384, bs=32, **kwargs)
    with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(n_epoch, 1e-2, cbs=list(cbs))
    return learn

def _params(learn): return [p.detach().clone() for p in learn.model.parameters()]

@pytest.fixture(scope='module')
def straight():
    "The uninterrupted `_fit`, without checkpoints"
    learn = _fit()
    return _params(learn),learn.recorder.values

def _same(learn, straight):
    for a,b in zip(_params(learn), straight[0], strict=True): assert torch.equal(a, b)
    assert learn.recorder.values == straight[1]

class Armed(Callback):
    "Call `f` after training batch `at` (counted over the fit)"
    def __init__(self, at, f): self.at,self.f,self.n = at,f,0
    def after_batch(self):
        if not self.training: return
        self.n += 1
        if self.n == self.at: self.f()

def test_memory_store_resumes_exactly(straight):
    "fsspec's `memory://`: stopped mid-epoch, resumed by a new learner from the URL alone, bit for bit"
    _fit([CheckpointCallback('memory://run', every_steps=3, every_epochs=None), StopAt(1, 4)])
    ck = latest_checkpoint('memory://run')
    assert ck.name == 'ckpt-e0001-b000003-f000' # 10 batches an epoch: the 12th step
    learn = _fit([CheckpointCallback('memory://run', every_steps=3, every_epochs=None, resume=True)])
    _same(learn, straight)

@pytest.mark.parametrize('async_save', [False, True])
def test_upload_cut_then_resumed(s3, straight, async_save):
    """The server stops answering 20 KB into the upload of the second checkpoint's tensor file (its two small files uploaded): the
    fit fails saying which upload, the first checkpoint stays the newest, and once the store is back a new learner resumes from it exactly; the partial one is pruned"""
    url,tries = f's3://ckpts/cut-{async_save}',defaults.checkpoint_upload_tries
    defaults.checkpoint_upload_tries = 2
    try:
        with pytest.raises(OSError) as e, warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            _fit([CheckpointCallback(url, every_steps=4, every_epochs=None, async_save=async_save), Armed(5, lambda: s3.link.cut_during(b'b000008-f000/__0_0.distcp', 20_000))])
    finally: defaults.checkpoint_upload_tries = tries
    s3.link.mend()
    assert (f"Checkpoint {url}/ckpt-e0000-b000008-f000 couldn't be written (OSError on process 0: Couldn't upload "
            f"{url}/ckpt-e0000-b000008-f000/__0_0.distcp in 2 tries") in str(e.value), e.value
    assert "the checkpoints before it are as they were" in str(e.value)
    assert latest_checkpoint(url).name == 'ckpt-e0000-b000004-f000'
    assert [p.name for p in scan_checkpoints(url)[1]] == ['ckpt-e0000-b000008-f000'] # what the cut left: never read
    learn = _fit([CheckpointCallback(url, every_steps=4, every_epochs=None, resume=True, async_save=async_save)])
    _same(learn, straight)
    # the `keep=2` newest of steps 12 and 16 (10 batches an epoch), and no leftover
    assert sorted(p.name for p in StorePath(url).iterdir()) == ['ckpt-e0001-b000003-f000', 'ckpt-e0001-b000007-f000']

def test_outage_during_a_save_is_retried(s3, straight, monkeypatch):
    """The store goes away in the middle of an upload and is back 2 s later: the file is uploaded again (s3fs's and botocore's own
    retries turned off here, which would otherwise hide this library's), and the checkpoint is whole"""
    import fsspec, s3fs
    monkeypatch.setattr(s3fs.S3FileSystem, 'retries', 1)
    monkeypatch.setitem(fsspec.config.conf, 's3', dict(config_kwargs=dict(retries=dict(max_attempts=1))))
    monkeypatch.setattr(defaults, 'checkpoint_upload_tries', 4, raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    learn = _fit()
    s3.link.cut_during(b'outage/ckpt/rng-0.pt', 1000, mend_after=2)
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter('always')
            learn.save_state('s3://ckpts/outage/ckpt')
    finally: monkeypatch.undo(); s3fs.S3FileSystem.clear_instance_cache()
    tried = [str(o.message) for o in w if 'trying again' in str(o.message)]
    assert tried and all(m.startswith('Uploading s3://ckpts/outage/ckpt/rng-0.pt failed') for m in tried), tried
    assert verify_checkpoint('s3://ckpts/outage/ckpt')
    fresh = synth_learner_digits(n=384, bs=32, seed=1)
    fresh.load_state('s3://ckpts/outage/ckpt')
    _same(fresh, straight)

def test_slow_store_uploads_in_the_background(s3, straight):
    """Every piece sent to the store waits 20 ms: with `async_save=True` training goes on while a checkpoint uploads, one upload in
    flight at a time, each checkpoint whole, and the fit the same as without checkpoints"""
    class Watch(Callback):
        order = 99 # after the checkpoint callback
        def before_fit(self): self.during,self.saves = 0,[]
        def after_batch(self):
            saving = getattr(self.learn, '_saving', None)
            if saving is None: return
            self.during += 1
            if not self.saves or self.saves[-1] is not saving[0]: self.saves.append(saving[0])
            assert all(f.done() for f in self.saves[:-1]) # the one before finished first
    url,watch = 's3://ckpts/slow',Watch()
    s3.link.delay = 0.02
    try: learn = _fit([CheckpointCallback(url, every_steps=3, every_epochs=None, keep=3, async_save=True), watch])
    finally: s3.link.delay = 0
    _same(learn, straight)
    assert watch.during > 0 and len(watch.saves) >= 2
    cks = sorted(p.name for p in StorePath(url).iterdir()) # the `keep=3` newest: steps 12, 15 and 18
    assert len(cks) == 3 and cks[-1] == 'ckpt-e0001-b000009-f000' and all(verify_checkpoint(f'{url}/{c}') for c in cks)

def test_partial_checkpoint_left_behind(s3, straight):
    """A newer checkpoint folder holding some objects (a cut-short tensor file) but no manifest is never resumed from, and is
    removed at the next prune; one whose manifest is there but a file is gone fails verification, and the fit resumes from the one
    before, with a warning"""
    url = 's3://ckpts/partial'
    _fit([CheckpointCallback(url, every_steps=3, every_epochs=None, keep=3), StopAt(0, 6)])
    good = sorted(p.name for p in StorePath(url).iterdir())
    assert good == ['ckpt-e0000-b000003-f000', 'ckpt-e0000-b000006-f000']
    part = StorePath(url)/'ckpt-e0000-b000009-f000'
    (part/'state.pt').write_bytes((StorePath(url)/good[-1]/'state.pt').read_bytes())
    (part/'__0_0.distcp').write_bytes((StorePath(url)/good[-1]/'__0_0.distcp').read_bytes()[:100])
    assert latest_checkpoint(url).name == good[-1] and [p.name for p in scan_checkpoints(url)[1]] == [part.name]
    (StorePath(url)/good[-1]/'__0_0.distcp').fs.rm_file(f'{url}/{good[-1]}/__0_0.distcp')
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        learn = _fit([CheckpointCallback(url, every_steps=3, every_epochs=None, keep=3, resume=True)])
    assert any(f"{url}/{good[-1]} can't be resumed from" in str(o.message) and 'missing' in str(o.message) for o in w)
    _same(learn, straight)
    assert part.name not in [p.name for p in StorePath(url).iterdir()] and not scan_checkpoints(url)[1]

def test_clear_errors_and_nothing_written(s3, monkeypatch, tmp_path):
    "No credentials, or no such bucket: an error naming the URL and what to do, before training, and nothing in the store"
    import s3fs
    for k in ('AWS_ACCESS_KEY_ID', 'AWS_SECRET_ACCESS_KEY'): monkeypatch.delenv(k)
    for k in ('AWS_SHARED_CREDENTIALS_FILE', 'AWS_CONFIG_FILE'): monkeypatch.setenv(k, str(tmp_path/'none'))
    s3fs.S3FileSystem.clear_instance_cache()
    learn = synth_learner_digits(n=384, bs=32)
    before = _params(learn)
    try:
        with pytest.raises(OSError, match=r"Can't reach checkpoint store s3://ckpts \(NoCredentialsError.*\): set AWS_ACCESS_KEY_ID"):
            learn.fit(1, cbs=CheckpointCallback('s3://ckpts/nocreds'))
        with pytest.raises(OSError, match='set AWS_ACCESS_KEY_ID'): learn.save_state('s3://ckpts/nocreds/ckpt')
    finally: monkeypatch.undo(); s3fs.S3FileSystem.clear_instance_cache()
    for a,b in zip(_params(learn), before): assert torch.equal(a, b) # refused before the first batch
    assert not StorePath('s3://ckpts/nocreds').exists()
    with pytest.raises(FileNotFoundError, match=r"Bucket s3://no-such-bucket doesn't exist: create it"):
        learn.save_state('s3://no-such-bucket/run/ckpt')
    assert not StorePath('s3://no-such-bucket').exists()

def test_verify_command_on_a_url(s3):
    "`fastxtend-verify-checkpoint s3://...`: a whole checkpoint passes; one with four bytes flipped in its tensors fails, named"
    learn = _fit(n_epoch=1)
    learn.save_state(url := 's3://ckpts/verify/ckpt')
    cmd = [os.path.join(os.path.dirname(sys.executable), 'fastxtend-verify-checkpoint'), url]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == f'{url}: its 4 files match their checksums'
    f = StorePath(url)/'__0_0.distcp'
    data = bytearray(f.read_bytes())
    data[len(data)//2:len(data)//2+4] = bytes(255 - b for b in data[len(data)//2:len(data)//2+4])
    f.write_bytes(bytes(data))
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 1 and res.stderr.startswith(f'Checkpoint file {url}/__0_0.distcp is corrupt: its CRC32')

def test_imports_without_s3fs():
    "Without s3fs the library imports and local checkpoints work; an S3 URL says what to install"
    code = """import sys; sys.modules['s3fs'] = None # as if not installed
from fastxtend_accel.all import *
from fastxtend_accel.test_utils import synth_learner_digits
learn = synth_learner_digits(n=128)
try: learn.fit(1, cbs=CheckpointCallback('s3://bucket/run'))
except ImportError as e: print(e)"""
    res = run_cmd([sys.executable, '-c', code])
    assert "Checkpoints at s3://bucket/run need fsspec's 's3' file system: `pip install fastxtend_accel[s3]` (s3fs)" in res.stdout, res
