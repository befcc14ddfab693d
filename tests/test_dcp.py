"""Sharded checkpoints (torch.distributed.checkpoint) on real launches: resume on another number of processes and on two nodes,
asynchronous saves killed mid-write, FSDP2 shards. Judged by the files the processes write (gloo may abort at exit)."""
import os, signal, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
import numpy as np, pytest, torch
from fastai.basics import Callback, L, OptimWrapper
from fastai.optimizer import ranger
from fastxtend_accel.checkpoint import CheckpointCallback, latest_checkpoint, checkpoint_to_weights
from fastxtend_accel.test_utils import synth_learner_digits, StopAt, torchrun_cmd, run_cmd, start_cmd, wait_for, kill_group, free_port
from fastxtend_accel.requeue import descendants
from fastxtend_accel.ema import EMACallback
from conftest import SCRIPTS

RESUME = SCRIPTS/'dcp_resume.py'
DCP_FILES = ['.metadata', '__0_0.distcp', '__1_0.distcp', 'manifest.json', 'rng-0.pt', 'rng-1.pt', 'state.pt']

def launch(n, out, *args):
    "Run dcp_resume.py on `n` processes (1: a plain process); its output"
    res = run_cmd(([sys.executable] if n == 1 else torchrun_cmd(n)) + [RESUME, out, *args], check=False)
    return res.stdout + res.stderr

def results(out, tag, n): return [torch.load(out/f'{tag}-rank{r}.pt', weights_only=False) for r in range(n)]

def close(params, ref, tol=1e-6):
    "Resumed on other process counts vs one uninterrupted process: sums in other orders, measured <= 8.9e-8 here"
    for a,b in zip(params, ref, strict=True): assert (a - b).abs().max() <= tol

@pytest.fixture(scope='module')
def reference():
    "The fit dcp_resume.py runs, uninterrupted, in this process"
    learn = _one_process_fit(64)
    return [p.detach() for p in learn.model.parameters()], learn.recorder.values, list(learn.ema.avg.values())

def _two_nodes(out, *args):
    "dcp_resume.py under `torchrun --nnodes 2 --nproc_per_node 1`: two launches meeting at a c10d rendezvous on localhost; their outputs"
    cmd = torchrun_cmd(1, nodes=2) + [RESUME, out, *args]
    procs = [start_cmd(cmd, env=dict(LAUNCH=l)) for l in 'AB']
    with ThreadPoolExecutor(2) as ex: return dict(zip('AB', ex.map(lambda p: p.communicate(timeout=300)[0].decode(), procs)))

def test_two_nodes_then_other_process_counts(tmp_path, reference):
    """Two nodes (one process each), stopped; resumed on 1 process, stopped; on 2, stopped; finished on 3: the same fit as one
    uninterrupted process, within 1e-6. Asynchronous saves on 2 processes."""
    outs = _two_nodes(tmp_path, '--tag', 'a', '--stop', '0,8', '--async-save')
    a = results(tmp_path, 'a', 2)
    # global ranks 0 and 1, each the main process of its node; per-node preparation on each node
    assert [(r['rank'], r['env_rank'], r['local_rank'], r['env_local_rank'], r['node'], r['is_main'], r['is_local_main']) for r in a] == [
        (0, 0, 0, 0, 0, True, True), (1, 1, 0, 0, 1, False, True)], outs
    assert all(r['prepared_first'] for r in a) and (tmp_path/'prepared-a-node0').exists() and (tmp_path/'prepared-a-node1').exists()
    # the global main process alone logs and writes single files (on its node's launch)
    main,other = outs[a[0]['launch']],outs[a[1]['launch']]
    assert 'train_loss' in main and 'train_loss' not in other
    assert (tmp_path/'models'/'final-a.pth').exists() and (tmp_path/'history-a.csv').exists()
    ck = tmp_path/'ckpt'/'ckpt-e0000-b000009-f000'
    assert latest_checkpoint(tmp_path/'ckpt') == ck and sorted(p.name for p in ck.iterdir()) == DCP_FILES
    assert not list((tmp_path/'ckpt').glob('.tmp-*')) # the asynchronous write was finished, and put in place, at the end of the fit
    # each process wrote its file, and the replicated DDP state (weights, Adam's two averages, the weights' EMA) is in them once
    one_copy,sizes = 4*4*sum(p.numel() for p in reference[0]),[(ck/f'__{r}_0.distcp').stat().st_size for r in range(2)]
    assert min(sizes) > 0 and one_copy <= sum(sizes) < 1.5*one_copy
    out = launch(1, tmp_path, '--tag', 'b', '--stop', '1,6')
    assert 'Resuming from' in out and 'written by 2 process(es), now 1' in out
    assert results(tmp_path, 'b', 1)[0]['resumed_from'] == 'ckpt-e0000-b000009-f000'
    launch(2, tmp_path, '--tag', 'c', '--stop', '1,12', '--async-save')
    c = results(tmp_path, 'c', 2)
    assert c[0]['resumed_from'] == 'ckpt-e0001-b000007-f000'
    assert [r['prepared_first'] for r in c] == [True, False] # `local_main_first`: the node's process 0, then its process 1
    out = launch(3, tmp_path, '--tag', 'd')
    d = results(tmp_path, 'd', 3)
    assert d[0]['resumed_from'] == 'ckpt-e0001-b000013-f000'
    for r in d: close(r['params'], reference[0]); close(r['ema'], reference[2]) # the average too, and validated
    np.testing.assert_allclose(d[0]['values'], reference[1], atol=1e-6)

def restarted(out, tag, *args):
    """dcp_resume.py under `torchrun --max-restarts 2` on 2 processes, each ending itself when stuck for 60 s (`WatchdogCallback`:
    a loader worker forked at the wrong moment can block forever in CPython 3.11, rarely); its result, once both finished"""
    res = run_cmd(torchrun_cmd(2, '--max-restarts', '2') + [RESUME, out, '--tag', tag, '--watchdog', 60, *args], check=False)
    assert all((out/f'{tag}-rank{i}.pt').exists() for i in range(2)), res.stdout[-2000:] + res.stderr[-4000:]
    return res

def stuck(res):
    "Whether a process of the launch was stuck and ended by its watchdog (the job then restarted once more than planned)"
    return 'WatchdogCallback: no batch ended' in res.stderr

def test_torchrun_restart_after_both_processes_killed(tmp_path, reference):
    """`torchrun --max-restarts 1`: both processes SIGKILLed mid-epoch, and in the restarted attempt process 1 starts 4 s late,
    so process 0 meets torchrun's store first. Each attempt's gloo group meets on keys of its own (without, process 0 read the
    killed attempt's addresses: `Gloo connectFullMesh failed ... Connection refused`), and the fit resumes exactly"""
    res = restarted(tmp_path, 'r', '--kill-at', '1,5', '--late-start', 4)
    r = results(tmp_path, 'r', 2)
    if not stuck(res): assert [x['attempt'] for x in r] == [1, 1] and [x['resumed_from'] for x in r] == ['ckpt-e0001-b000004-f000']*2
    for x in r: close(x['params'], reference[0]); close(x['ema'], reference[2])
    np.testing.assert_allclose(r[0]['values'], reference[1], atol=1e-6)

@pytest.mark.parametrize('case,args,resumed', [
    ('one killed', ['--kill-at', '1,5', '--fail-ranks', '1'], 'ckpt-e0001-b000004-f000'),
    ('one raising', ['--kill-at', '1,5', '--fail', 'raise', '--fail-ranks', '1'], 'ckpt-e0001-b000004-f000'),
    # frozen: the other waits in DDP's gradient all-reduce until the process group's timeout (15 s), fails, and torchrun ends
    # the frozen one (SIGKILL, 30 s after its SIGTERM); with the default timeout (30 min) the same, later
    ('one frozen', ['--kill-at', '1,5', '--fail', 'stop', '--fail-ranks', '1', '--pg-timeout', '15'], 'ckpt-e0001-b000004-f000'),
    # killed once its shard of the next checkpoint is written: that one is incomplete, the one before is resumed
    ('killed writing', ['--kill-in-write', 'ckpt-e0001-b000004', '--fail-ranks', '1'], 'ckpt-e0001-b000001-f000'),
])
def test_torchrun_restart_after_one_process_fails(tmp_path, reference, case, args, resumed):
    """`torchrun --max-restarts 1`: process 1 fails mid-epoch while process 0 goes on into the next collective (it fails there
    in turn, and torchrun restarts both); the restarted attempt resumes from the newest whole checkpoint, exactly"""
    res = restarted(tmp_path, 'f', *args)
    r,out = results(tmp_path, 'f', 2),res.stdout + res.stderr
    if not stuck(res):
        assert [x['attempt'] for x in r] == [1, 1] and [x['resumed_from'] for x in r] == [resumed]*2
        assert 'resume 1 of this run: it stopped without a checkpoint of its own (killed, or it failed)' in out
        assert 'torchrun restart 1' in out
    assert not list((tmp_path/'ckpt').glob('.tmp-*')) # what the failed write left was removed
    for x in r: close(x['params'], reference[0]); close(x['ema'], reference[2])
    np.testing.assert_allclose(r[0]['values'], reference[1], atol=1e-6)

def test_elastic_node_lost_then_back(tmp_path, reference):
    """`torchrun --nnodes 1:2` on two simulated nodes of one process each (c10d rendezvous on localhost; a store of each round's
    own, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1). Node B, its agent and its process, is killed mid-epoch: node A goes on alone
    from the newest checkpoint. B comes back: torchrun stops A's process (SIGTERM: it checkpoints) and both go on together.
    The fit ends where one uninterrupted process does."""
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nnodes', '1:2', '--nproc_per_node', '1', '--rdzv-backend', 'c10d',
           '--rdzv-endpoint', f'localhost:{free_port()}', '--rdzv-conf', 'last_call_timeout=3', '--max-restarts', '3',
           '--monitor-interval', '1', RESUME, tmp_path, '--tag', 'e', '--sleep', 0.25,
           '--sleep-alone', 3] # A alone has ~45 batches left: slowed down, it can't end them before B2 has started and joined
    env = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONWARNINGS': 'ignore', 'TORCH_DISABLE_SHARE_RDZV_TCP_STORE': '1'}
    def node(k): # its output in a file: a pipe nobody reads would fill up and stop it
        with open(tmp_path/f'{k}.log', 'w') as log:
            return subprocess.Popen(list(map(str, cmd)), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    def log(*ks): return ''.join((tmp_path/f'{k}.log').read_text() for k in ks)
    def progress(): return tuple(map(int, (tmp_path/'progress-e').read_text().split())) if (tmp_path/'progress-e').exists() else ()
    nodes = [node('A')]
    try:
        time.sleep(4) # A hosts the rendezvous' store (the first to take the port), as the node of --rdzv-endpoint would
        nodes.append(node('B'))
        wait_for(lambda: progress() >= (0, 8), timeout=180)
        for p in descendants(nodes[1].pid) + [nodes[1].pid]: os.kill(p, signal.SIGKILL)
        wait_for(lambda: 'now 1)' in log('A'), timeout=180) # A resumed alone
        nodes.append(node('B2'))
        assert [p.wait(300) for p in (nodes[0], nodes[2])] == [0, 0], log('A', 'B2')[-5000:]
    finally:
        for p in nodes: p.kill() if p.poll() is None else None
    out = log('A', 'B2')
    assert 'written by 2 process(es), now 1); resume 1 of this run: it stopped without a checkpoint of its own' in out
    assert 'written by 1 process(es), now 2); resume 2 of this run: it stopped on SIGTERM' in out
    r = results(tmp_path, 'e', 2)
    for x in r: close(x['params'], reference[0]); close(x['ema'], reference[2])
    np.testing.assert_allclose(r[0]['values'], reference[1], atol=1e-6)

def test_async_save_killed_while_writing(tmp_path, reference):
    "Training goes on while a checkpoint is written; killed before it is complete, the run resumes from the one before, exactly"
    proc = start_cmd([sys.executable, RESUME, tmp_path, '--tag', 'k', '--async-save', '--slow-write', '600', '--sleep', '0.05'])
    tmp = tmp_path/'ckpt'/'.tmp-ckpt-e0001-b000001-f000' # the first checkpoint whose write is slowed
    progress = lambda: tuple(map(int, (tmp_path/'progress-k').read_text().split()))
    wait_for(lambda: (tmp/'state.pt').exists() and progress() >= (1, 2), proc)
    assert not (tmp/'.metadata').exists() # two batches later, still being written
    kill_group(proc)
    assert latest_checkpoint(tmp_path/'ckpt').name == 'ckpt-e0000-b000015-f000'
    launch(1, tmp_path, '--tag', 'k2')
    res, = results(tmp_path, 'k2', 1)
    assert res['resumed_from'] == 'ckpt-e0000-b000015-f000'
    assert not list((tmp_path/'ckpt').glob('.tmp-*')) # what the kill left was removed
    close(res['params'], reference[0], 0); close(res['ema'], reference[2], 0)
    assert res['values'] == reference[1]

def test_resume_with_other_global_batch(tmp_path):
    "Resumed with another global batch: a warning says so, and the fit goes on from the next item"
    class Items(Callback):
        def before_fit(self): self.xbs = []
        def before_batch(self):
            if self.training: self.xbs.append(self.xb[0].clone())
    learn = synth_learner_digits(n=512, bs=32)
    with learn.no_bar(), learn.no_logging(): learn.fit(3, 1e-2, cbs=[CheckpointCallback(tmp_path, every_steps=3), StopAt(1, 5)])
    ck = latest_checkpoint(tmp_path)
    assert ck.name == 'ckpt-e0001-b000006-f000'
    order = torch.load(ck/'state.pt')['position']['order']
    learn = synth_learner_digits(n=512, bs=16)
    items = Items()
    with learn.no_bar(), learn.no_logging(), pytest.warns(UserWarning, match="batches of 32 items, this run's have 16"):
        learn.fit(3, 1e-2, cbs=[CheckpointCallback(tmp_path, every_steps=3, resume=True), items])
    rest = len(order) - 6*32 # items of epoch 1 not trained on yet
    assert len(items.xbs) == rest//16 + len(order)//16
    ds = learn.dls.train.dataset
    assert torch.equal(items.xbs[0], torch.stack([ds[i][0] for i in order[6*32:6*32+16]]))

def _flat(o, key=''):
    "Nested dicts and lists as one dict by dotted path"
    if isinstance(o, dict): return {k2: v2 for k,v in o.items() for k2,v2 in _flat(v, f'{key}.{k}').items()}
    if isinstance(o, (list, tuple, L)): return {k2: v2 for i,v in enumerate(o) for k2,v2 in _flat(v, f'{key}.{i}').items()}
    return {key: o}

def _same_opt(a, b):
    a,b = _flat(a.opt.state_dict()),_flat(b.opt.state_dict())
    assert a.keys() == b.keys() and all(torch.equal(v, b[k]) if isinstance(v, torch.Tensor) else v == b[k] for k,v in a.items())

@pytest.mark.parametrize('opt_func', [partial(OptimWrapper, opt=torch.optim.AdamW), ranger], ids=['torch AdamW', 'ranger'])
def test_optimizers_round_trip(tmp_path, opt_func):
    "A torch optimizer (its `step` tensors) and fastai's `Lookahead` (slow weights): back from the checkpoint, and from its one-file form"
    learn = synth_learner_digits(n=256, opt_func=opt_func)
    with learn.no_bar(), learn.no_logging(): learn.fit(1, 1e-2)
    learn.save_state(tmp_path/'ck')
    checkpoint_to_weights(tmp_path/'ck', tmp_path/'models'/'weights.pth')
    for load in (lambda l: l.load_state(tmp_path/'ck'), lambda l: l.load('weights')):
        new = synth_learner_digits(n=256, opt_func=opt_func, seed=1, path=tmp_path)
        load(new)
        close([p.detach() for p in new.model.parameters()], [p.detach() for p in learn.model.parameters()], 0)
        _same_opt(new, learn)

def _one_process_fit(hidden):
    "One uninterrupted process, batches of 36, one thread as the launched ones"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        learn = synth_learner_digits(n=768, bs=36, hidden=hidden, cbs=EMACallback(decay=0.9))
        with learn.no_bar(), learn.no_logging(): learn.fit_one_cycle(3, 1e-2)
    finally: torch.set_num_threads(threads)
    return learn

def _same_state(learn, saved):
    close([p.detach() for p in learn.model.parameters()], saved['params'], 0)
    for st,exp in zip([learn.opt.state[p] for p,*_ in learn.opt.all_params()], saved['opt'], strict=True):
        assert exp and all(torch.equal(st[k], v) for k,v in exp.items())

def test_fsdp2_resume_on_other_process_counts(tmp_path):
    """FSDP2 through `learn.accelerate(fsdp_plugin=...)`: 2 processes, stopped; resumed on 3, each process its own (uneven) shards of the
    model and of its optimizer state: the same fit as one uninterrupted process. The checkpoint of 2 also loads into one plain process,
    and as one file into a plain fastai `Learner`."""
    script = SCRIPTS/'dcp_fsdp.py'
    run_cmd(torchrun_cmd(2) + [script, tmp_path, '--tag', 'a', '--stop', '0,8'], check=False)
    a,saved = results(tmp_path, 'a', 2),torch.load(tmp_path/'a-full.pt')
    assert [(r['dtensor'], r['local'], r['opt_local']) for r in a] == [(True, [25, 25, 5, 5], [25, 25, 5, 5])]*2 # half each
    ck = latest_checkpoint(tmp_path/'ckpt')
    assert ck.name == 'ckpt-e0000-b000009-f000' and sorted(p.name for p in ck.iterdir()) == DCP_FILES
    learn = synth_learner_digits(n=768, bs=36, hidden=50)
    learn.load_state(ck) # one process, no process group: whole tensors
    _same_state(learn, saved)
    checkpoint_to_weights(ck, tmp_path/'models'/'weights.pth')
    plain = synth_learner_digits(n=768, bs=36, hidden=50, seed=1, path=tmp_path)
    plain.load('weights') # fastai's own loader
    _same_state(plain, saved)
    run_cmd(torchrun_cmd(3) + [script, tmp_path, '--tag', 'd'], check=False)
    d,final = results(tmp_path, 'd', 3),torch.load(tmp_path/'d-full.pt')
    assert [(r['dtensor'], r['local'], r['opt_local'], r['resumed_from']) for r in d] == [
        (True, s, s, ck.name) for s in ([17, 17, 4, 4], [17, 17, 4, 4], [16, 16, 2, 2])] # 50 and 10 rows over 3 processes
    ref = _one_process_fit(50)
    close(final['params'], [p.detach() for p in ref.model.parameters()])
    close(final['ema'], list(ref.ema.avg.values())) # each process averaged its shards; gathered, the one-process average
    assert [r['ema_local'] for r in d] == [r['local'] for r in d] # sharded as the weights
    np.testing.assert_allclose(d[0]['values'], ref.recorder.values, atol=1e-6)
