"""The compatibility matrix (`fastxtend_accel.compatibility`): fastai's learners trained with every pair of the
library's options together, each cell held to its verdict (same as its reference, resumed exactly, or refused up
front), in three launches of tests/scripts/matrix_cells.py (1 process, 2 with torchrun, 1 again for the resumes);
and the page nbs/reference/compatibility.ipynb, which is made from the verdicts.

When a verdict changes (a refusal lifted by a new feature), the page test fails: run
`FASTXTEND_WRITE_MATRIX_PAGE=1 pytest tests/test_compatibility.py` to write the page again, and commit it."""
import json, os, subprocess, sys
import pytest, torch
from torch import nn
from fastxtend_accel.compatibility import *
from fastxtend_accel.test_utils import torchrun_cmd, run_cmd
from conftest import SCRIPTS, REPO

CELLS = covering_array()
PAGE = REPO/'nbs'/'reference'/'compatibility.ipynb'
TABLE_START = '<!-- the table: made by tests/test_compatibility.py from the verdicts -->'

def _bf16_lstm():
    "Whether torch's CPU bf16 autocast runs `nn.LSTM` here (oneDNN has a bf16 kernel for it with AVX-512)"
    try:
        with torch.autocast('cpu', dtype=torch.bfloat16): nn.LSTM(2, 2)(torch.zeros(1, 1, 2))
        return True
    except RuntimeError: return False
BF16_LSTM = _bf16_lstm()

@pytest.fixture(scope='module')
def matrix(tmp_path_factory):
    "Every cell's runs: (kind, cell id) -> what rank 0 saved; and the folder"
    out = tmp_path_factory.mktemp('matrix')
    launches = plan(CELLS, BF16_LSTM)
    for name,jobs in launches.items(): (out/f'{name}.json').write_text(json.dumps(jobs))
    script = [SCRIPTS/'matrix_cells.py', out]
    for name,cmd in (('one', [sys.executable]), ('two', torchrun_cmd(2)), ('resume_one', [sys.executable])):
        # a launch that runs over its time leaves the results of the jobs it finished; the others fail their cells
        try: run_cmd(cmd + script + [name], timeout=900, check=False)
        except subprocess.TimeoutExpired: pass
    runs = {}
    for f in out.glob('*-rank*.pt'):
        r = torch.load(f, weights_only=False)
        runs[r['kind'], cell_id(r['cell']), int(f.stem.rsplit('rank', 1)[1])] = r
    return runs, out

def _rank0(runs): return {(k, c): r for (k,c,rank),r in runs.items() if rank == 0}

def _log(out, kind, cell):
    "What a job printed, for a failure's message"
    f = out/f'{kind}-{cell}-rank0.log'
    return f.read_text()[-3000:] if f.exists() else '(no output)'

@pytest.mark.parametrize('cell', [cell_id(c) for c in CELLS])
def test_cell(matrix, cell):
    "Each cell reaches its verdict: refused up front, or trained as its reference (and resumed exactly)"
    runs,out = matrix
    c = parse_cell(cell)
    v = verdict(c, _rank0(runs), BF16_LSTM)
    want = 'refused' if refusal(c, BF16_LSTM) else 'same' if c['checkpoint'] == 'none' else 'resumed'
    assert v['verdict'] == want, f"{v}\n{_log(out, 'straight', cell)}"
    if want == 'refused': return
    s = runs['straight', cell, 0]
    if world_size(c) == 2: # one model: what rank 1 holds after the fit, gathered, is rank 0's
        assert difference(s, runs['straight', cell, 1]) == 0
    if c['callbacks'] == 'guard': assert s['skipped'] == [] # finite losses: no step skipped
    if c['checkpoint'] != 'none': # both processes killed themselves after their 8th batch, past a checkpoint
        assert all((out/f'killed-{cell}-rank{r}').exists() for r in range(world_size(c)))
        assert runs['resume', cell, 0]['resumed_from'].startswith('ckpt-')
        assert '-b000000-' not in runs['resume', cell, 0]['resumed_from'] # mid-epoch: a language model's streams too

def test_tensorboard_logs_the_recorder(matrix):
    "Cells with `log_with='tensorboard'`: TensorBoard's own reader finds each epoch's validation loss of the `Recorder`"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    runs,out = matrix
    cells = [c for c in CELLS if c['callbacks'] == 'monitors' and refusal(c, BF16_LSTM) is None]
    assert cells
    for c in cells:
        s = runs['straight', cell_id(c), 0]
        (folder,) = (out/f'tb-straight-{cell_id(c)}').iterdir()
        ea = EventAccumulator(str(folder)).Reload()
        logged = [e.value for e in ea.Scalars('valid_loss')]
        assert logged == pytest.approx([row[s['names'].index('valid_loss')] for row in s['values']], abs=1e-6)

def _page_table():
    "The table cell of the committed page"
    nb = json.loads(PAGE.read_text())
    (src,) = [''.join(c['source']) for c in nb['cells'] if ''.join(c['source']).startswith(TABLE_START)]
    return src

def test_page_is_the_verdicts(matrix):
    "nbs/reference/compatibility.ipynb shows the verdicts of this run"
    runs,_ = matrix
    table = TABLE_START + '\n\n' + compatibility_page([verdict(c, _rank0(runs), BF16_LSTM) for c in CELLS])
    if os.environ.get('FASTXTEND_WRITE_MATRIX_PAGE'):
        assert BF16_LSTM, "write the page on a CPU with AVX-512, where every cell trains (here some are '?')"
        nb = json.loads(PAGE.read_text())
        for c in nb['cells']:
            if ''.join(c['source']).startswith(TABLE_START): c['source'] = table.splitlines(keepends=True)
        PAGE.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')
    committed = _page_table()
    if not BF16_LSTM: # the cells of AWD-LSTMs in bf16 were refused here: the pairs only they cover are unknown ('?')
        lines = [(a, b) for a,b in zip(committed.splitlines(), table.splitlines()) if a != b]
        marks = [(x, y) for a,b in lines for x,y in zip(a.split('|'), b.split('|')) if x != y]
        marks = [(x.strip(), y.strip()) for x,y in marks]
        assert len(committed.splitlines()) == len(table.splitlines())
        assert all(y == '?' and x.startswith('✓') for x,y in marks), marks
        return
    assert committed == table, ("The matrix's verdicts changed: write the page again with "
                                "`FASTXTEND_WRITE_MATRIX_PAGE=1 pytest tests/test_compatibility.py`")
