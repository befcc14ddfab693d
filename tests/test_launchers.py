"Preemption and single writers under the launchers users run (tests/scripts/preempt_train.py, tests/scripts/launch_writers.py): judged by the files the ranks write."
import json, signal, sys
import psutil, pytest, torch
from fastxtend_accel.checkpoint import latest_checkpoint
from fastxtend_accel.test_utils import torchrun_cmd, run_cmd, start_cmd, wait_for, signal_proc, free_port
from conftest import SCRIPTS

PREEMPT,WRITERS = SCRIPTS/'preempt_train.py',SCRIPTS/'launch_writers.py'

def _ended(d): return [json.loads((d/f'ended-rank{r}.json').read_text()) for r in range(2)]
def _finals(d): return [torch.load(d/f'final-rank{r}.pt', weights_only=False) for r in range(2)]

def _preempt(d, sig, ready):
    "Launch on 2 processes, send `sig` to torchrun once both ranks are `ready` batches in, check how they ended; returns the checkpoint"
    for f in d.glob('*-rank*'): f.unlink()
    proc = start_cmd(torchrun_cmd(2) + [PREEMPT, d, '--ready', ready])
    wait_for(lambda: all((d/f'ready-rank{r}').exists() for r in range(2)), proc)
    signal_proc(proc, sig) # torchrun passes it on to each process's group: its loader workers get it too
    out = proc.stdout.read().decode()
    assert all((d/f'ended-rank{r}.json').exists() for r in range(2)), out[-3000:]
    ended = _ended(d)
    assert [e['code'] for e in ended] == [0, 0], out[-3000:] # each rank left through the checkpoint's `SystemExit(0)`
    ck = latest_checkpoint(d/'ckpt')
    assert not [p.name for p in (d/'ckpt').iterdir() if not p.name.startswith('ckpt-')] # no temporary folder left
    # each process wrote its part of the tensors (DCP) and its random states; the main process the rest
    assert sorted(p.name for p in ck.iterdir()) == ['.metadata', '__0_0.distcp', '__1_0.distcp', 'manifest.json', 'rng-0.pt',
                                                   'rng-1.pt', 'state.pt']
    epoch,batch = int(ck.name[6:10]),int(ck.name[12:18])
    assert batch > 0 and all(e['seen'] in (None, [epoch, batch]) for e in ended) and any(e['seen'] for e in ended)
    workers = [p for e in ended for p in e['workers']]
    assert workers and not any(psutil.pid_exists(p) for p in workers) # the loader workers outlived the signal, then ended with their rank
    assert not (d/'final-rank0.pt').exists()
    return epoch,batch

def test_preempt_torchrun_with_loader_workers(tmp_path_factory):
    "SIGTERM, then SIGINT after resuming, to torchrun mid-epoch with 2 loader workers per rank; the twice-resumed fit equals an uninterrupted one"
    ref,d = tmp_path_factory.mktemp('ref'),tmp_path_factory.mktemp('preempt')
    run_cmd(torchrun_cmd(2) + [PREEMPT, ref], check=False)
    assert all(e['code'] is None for e in _ended(ref))
    first = _preempt(d, signal.SIGTERM, 25) # 19 batches an epoch: in epoch 1
    second = _preempt(d, signal.SIGINT, 15)
    assert first < second
    run_cmd(torchrun_cmd(2) + [PREEMPT, d], check=False)
    for res,exp in zip(_finals(d), _finals(ref)):
        assert all(torch.equal(a, b) for a,b in zip(res['params'], exp['params']))
        assert res['values'] == exp['values']

def test_failed_or_killed_save_leaves_no_temp_folder(tmp_path):
    "A save that raises removes its temporary folder; one a kill left is removed at the next checkpoint"
    from fastxtend_accel.all import CheckpointCallback
    from fastxtend_accel.test_utils import synth_learner_digits
    learn = synth_learner_digits(n=256)
    with learn.no_bar(), learn.no_logging(): learn.fit(1)
    def full_disk(): raise OSError(28, 'No space left on device')
    learn.opt.state_dict = full_disk # raises after the random states are written
    with pytest.raises(OSError, match='No space left'): learn.save_state(tmp_path/'ck')
    assert list(tmp_path.iterdir()) == []
    del learn.opt.state_dict
    (tmp_path/'.tmp-ckpt-e0000-b000003-f000').mkdir() # as a SIGKILL during a checkpoint leaves it
    with learn.no_bar(), learn.no_logging(): learn.fit(1, cbs=CheckpointCallback(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ['ckpt-e0001-b000000-f000']

def _in_function(launcher, d, **kw):
    "The command running `launch_writers.main(d)` on 2 processes with Accelerate's `launcher`, from a Python script"
    return [sys.executable, '-c', f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); from launch_writers import main; "
            f"from accelerate import {launcher}; {launcher}(main, ({str(d)!r},), num_processes=2, **{kw!r})"]

@pytest.mark.parametrize('launcher', ['torchrun', 'debug_launcher', 'notebook_launcher'])
def test_one_writer(tmp_path, launcher):
    "`CSVLogger`, `SaveModelCallback`, `save` and `export` write each file from the main process alone, whatever `RANK` says"
    cmd = dict(torchrun=lambda: torchrun_cmd(2) + [WRITERS, tmp_path], debug_launcher=lambda: _in_function('debug_launcher', tmp_path),
               notebook_launcher=lambda: _in_function('notebook_launcher', tmp_path, use_port=str(free_port())))[launcher]()
    res = run_cmd(cmd, check=False)
    assert all((tmp_path/f'rank{r}.json').exists() for r in range(2)), res.stdout[-2000:] + res.stderr[-3000:]
    r0,r1 = [json.loads((tmp_path/f'rank{r}.json').read_text()) for r in range(2)]
    assert r0['world'] == r1['world'] == 2
    assert sorted(set(r0['written'])) == ['export.pkl', 'history.csv', 'models/best.pth', 'models/final.pth'] and r1['written'] == []
    assert r0['saved'] == r1['saved'] == str(tmp_path/'models'/'final.pth')
    assert (r0['env_rank'], r1['env_rank']) == (0, 1) # what fastai's own guards (TensorBoard, W&B) go by, `debug_launcher` included
