"""conftest.py - shared settings of the Python package's tests: no network for
transformers, and the import check that says how to build the package."""

import os

# The model tests build tiny models from config objects; nothing is downloaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


def pytest_report_header(config):
    try:
        import rmsnorm
    except ImportError as err:  # say why at the top, before 100 failures
        return f"rmsnorm: NOT IMPORTABLE ({err})"
    return (f"rmsnorm {rmsnorm.__version__} from {os.path.dirname(rmsnorm.__file__)}, "
            f"kernels {rmsnorm.isa()}, threads {rmsnorm.get_num_threads()}")


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(1234)
