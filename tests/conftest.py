"Where the tests and the scripts they launch live, and a fixture; launching and waiting are `fastxtend_accel.test_utils`'s."
from pathlib import Path
import pytest

SCRIPTS = Path(__file__).parent/'scripts'
REPO = Path(__file__).parent.parent

@pytest.fixture
def fresh_state():
    "Empty dynamo caches and counters, and no Accelerate state, before the test and after it"
    import torch
    from fastxtend_accel.patching import reset_accelerate_state, clear_compiled_graphs
    torch.compiler.reset(); clear_compiled_graphs()
    reset_accelerate_state(partial=True)
    yield
    reset_accelerate_state(partial=True)
