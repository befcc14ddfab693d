"""Checkpoints that verify themselves, on real processes: every kind of damage refused alike by every process with the
learner untouched (tests/scripts/damaged_load.py); a fit resuming from the newest good checkpoint, equal to one never
interrupted; a checkpoint of before checksums; the command line."""
import sys, warnings
from pathlib import Path
import pytest, torch
from fastai.basics import set_seed
from fastai.callback.schedule import fit_one_cycle
from fastxtend_accel.test_utils import (synth_learner_digits, tiny_mlp, StopAt, torchrun_cmd, run_cmd, run_ranks,
                                        flip_bytes)
from fastxtend_accel.checkpoint.codec import read_state_file, write_state_file
from fastxtend_accel.checkpoint.checksums import verify_checkpoint
from fastxtend_accel.checkpoint import CheckpointCallback, latest_checkpoint
from conftest import SCRIPTS

def files(n): return sorted(['.metadata', 'manifest.json', 'state.pt', *(f'__{r}_0.distcp' for r in range(n)),
                             *(f'rng-{r}.pt' for r in range(n))])
DAMAGES = ('flip@0', 'flip@0.25', 'flip@0.5', 'flip@0.75', 'flip@1', 'cut', 'missing')

@pytest.mark.parametrize('n', [1, 2])
def test_damage_refused_alike_learner_untouched(tmp_path, n):
    "Each file of a checkpoint flipped at 5 places, cut short, missing; not a checkpoint; another model's; an old one"
    ranks = run_ranks(([sys.executable] if n == 1 else torchrun_cmd(n)) + [SCRIPTS/'damaged_load.py', tmp_path], tmp_path, n)
    res,ck = ranks[0]['results'],tmp_path/'ck'
    assert all(r['results'] == res for r in ranks[1:]) # every process raised the same error, or loaded
    assert sorted({k[0] for k in res if isinstance(k, tuple)}) == files(n)
    for name in files(n):
        for kind in DAMAGES:
            (typ,msg),untouched = res[name, kind]
            said = 'is missing: the checkpoint is incomplete' if kind == 'missing' else 'is corrupt: '
            assert typ == 'ValueError' and msg.startswith(f"Checkpoint file {ck/name} {said}") and untouched, (name, kind, msg)
    expected = dict(nothing=f"Checkpoint {tmp_path/'nothing'} does not exist",
                    empty=f"Checkpoint file {tmp_path/'empty'/'state.pt'} is missing: the checkpoint is incomplete",
                    other=f"Checkpoint {tmp_path/'other'} is of another model: 0.weight: [32, 64] in checkpoint, [64, 64] here")
    expected['ck/state.pt'] = f"Checkpoint {ck/'state.pt'} is a file, not a checkpoint's folder"
    for case,msg in expected.items():
        (typ,got),untouched = res[case]
        assert typ == 'ValueError' and got.startswith(msg) and untouched, (case, got)
    assert res['whole'][0] == 'ok' and res['old'] == ('ok', True) # put back, it loads; without checksums, it loads too
    notice = f"Checkpoint {tmp_path/'old'} has no checksums (written by an older fastxtend_accel): read without verifying it"
    assert [r['old_warnings'] for r in ranks] == [[notice]] + [[]]*(n-1) # once, on the main process

def one_cycle(path, *cbs):
    "The notebook's resumable fit (dropout, shuffling), checkpointing every 4 steps into `path`, resuming from there"
    set_seed(0)
    learn = synth_learner_digits(n=512, bs=32)
    learn.model = tiny_mlp(p=0.3)
    cb = CheckpointCallback(path, every_steps=4, resume=True)
    with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(3, 1e-2, cbs=[cb, *cbs])
    return learn,cb

@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    learn,_ = one_cycle(tmp_path_factory.mktemp('whole'))
    return [p.detach().clone() for p in learn.model.parameters()],learn.recorder.values

def cut(fn): fn.write_bytes(fn.read_bytes()[:fn.stat().st_size//2])
def written_before_checksums(fn):
    "Make the checkpoint of manifest `fn` one written before checksums: no manifest, no word of one in `state.pt`"
    fn.unlink()
    st = read_state_file(fn.parent/'state.pt')
    del st['manifest']
    write_state_file(st, fn.parent/'state.pt')

@pytest.mark.parametrize('name,damage', [('manifest.json', Path.unlink), ('state.pt', flip_bytes), ('rng-0.pt', cut),
                                         ('.metadata', flip_bytes), ('manifest.json', written_before_checksums)])
def test_resume_falls_back_one_process(tmp_path, uninterrupted, name, damage):
    "The newest checkpoint damaged or incomplete: a warning names it, and the fit resumes from the one before, exactly"
    one_cycle(tmp_path, StopAt(1, 9))
    before,newest = sorted(tmp_path.glob('ckpt-*'))[-2:]
    assert latest_checkpoint(tmp_path) == newest
    damage(newest/name)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter('always')
        learn,cb = one_cycle(tmp_path)
    said = [str(w.message) for w in ws if 'checksums' in str(w.message) or "can't be resumed" in str(w.message)]
    if damage is written_before_checksums: # resumed from, unverified
        assert cb.resumed_from == newest and said == [f"Checkpoint {newest} has no checksums (written by an older "
                                                      "fastxtend_accel): read without verifying it"]
    else:
        assert cb.resumed_from == before
        assert len(said) == 1 and said[0].startswith(f"Checkpoint {newest} can't be resumed from: Checkpoint file "
                                                     f"{newest/name} is"), said
    for a,b in zip(learn.model.parameters(), uninterrupted[0]): assert torch.equal(a, b)
    assert learn.recorder.values == uninterrupted[1]

RESUME = SCRIPTS/'dcp_resume.py'

def launch(out, tag, *args, env=None):
    "dcp_resume.py on 2 processes; each one's result file, and the output"
    res = run_cmd(torchrun_cmd(2) + [RESUME, out, '--tag', tag, *args], check=False, env=env)
    fns = [out/f'{tag}-rank{r}.pt' for r in range(2)]
    assert all(f.exists() for f in fns), res.stdout[-3000:] + res.stderr[-5000:]
    return [torch.load(f, weights_only=False) for f in fns],res.stdout + res.stderr

def test_resume_falls_back_two_processes(tmp_path):
    """2 processes checkpoint in the background and stop; process 1's tensor file of the newest checkpoint is damaged; both
    processes resume from the one before, the main process alone warning, and end as 2 processes never interrupted"""
    (tmp_path/'ref').mkdir()
    ref,_ = launch(tmp_path/'ref', 'ref')
    launch(tmp_path, 'a', '--stop', '1,6', '--async-save')
    before,newest = sorted((tmp_path/'ckpt').glob('ckpt-*'))[-2:]
    for ck in (before, newest): assert sorted(verify_checkpoint(ck)) == [f for f in files(2) if f != 'manifest.json']
    flip_bytes(newest/'__1_0.distcp')
    res,out = launch(tmp_path, 'b', env=dict(PYTHONWARNINGS='default'))
    assert out.count("can't be resumed from: Checkpoint file") == 1 and f"Checkpoint file {newest/'__1_0.distcp'} is corrupt" in out, out[-3000:]
    assert [r['resumed_from'] for r in res] == [before.name]*2
    for r,e in zip(res, ref):
        for a,b in zip(r['params'], e['params']): assert torch.equal(a, b)
    assert res[0]['values'] == ref[0]['values']

def test_command_line(tmp_path):
    "`fastxtend-verify-checkpoint PATH` and `python -m fastxtend_accel.checkpoint PATH`: one line, exit status 1 if bad"
    learn = synth_learner_digits(n=128)
    with learn.no_bar(), learn.no_logging(): learn.fit(1)
    ck = learn.save_state(tmp_path/'ck')
    for cmd in ([Path(sys.executable).parent/'fastxtend-verify-checkpoint'], [sys.executable, '-m', 'fastxtend_accel.checkpoint']):
        good = run_cmd(cmd + [ck], check=False)
        assert (good.returncode, good.stdout, good.stderr) == (0, f"{ck}: its 4 files match their checksums\n", '')
        kept = flip_bytes(ck/'rng-0.pt')
        bad = run_cmd(cmd + [ck], check=False)
        (ck/'rng-0.pt').write_bytes(kept)
        assert bad.returncode == 1 and bad.stdout == '' and bad.stderr.count('\n') == 1, bad
        assert bad.stderr.startswith(f"Checkpoint file {ck/'rng-0.pt'} is corrupt: its CRC32C is")
