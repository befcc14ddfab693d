"Where the tests and the scripts they launch live, and a fixture; launching and waiting are `fastxtend_accel.test_utils`'s."
from pathlib import Path
import pytest

SCRIPTS = Path(__file__).parent/'scripts'
REPO = Path(__file__).parent.parent

# the 2-process launches that many tests share: DDP against one process, FSDP2 against DDP (each cell of the version matrix,
# tools/matrix.sh, runs the tests marked `matrix`)
MATRIX_FIXTURES = {'test_core.py': 'scenarios', 'test_fsdp.py': 'runs'}

def pytest_collection_modifyitems(items):
    "Mark `matrix` the tests of the launches in `MATRIX_FIXTURES`"
    for it in items:
        if MATRIX_FIXTURES.get(it.path.name) in getattr(it, 'fixturenames', ()): it.add_marker(pytest.mark.matrix)

@pytest.fixture
def fresh_state():
    "Empty dynamo caches and counters, and no Accelerate state, before the test and after it"
    import torch
    from fastxtend_accel.patching import reset_accelerate_state, clear_compiled_graphs
    torch.compiler.reset(); clear_compiled_graphs()
    reset_accelerate_state(partial=True)
    yield
    reset_accelerate_state(partial=True)
