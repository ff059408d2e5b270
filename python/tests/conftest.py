import numpy as np
import pytest

import kiln


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def close(k, want, rtol=1e-5, atol=1e-6):
    """Asserts a Kiln tensor equals a NumPy array (shape, values), printing both on failure."""
    got = k.numpy(force=True) if isinstance(k, kiln.Tensor) else np.asarray(k)
    want = np.asarray(want)
    assert got.shape == want.shape, f"shape {got.shape} != {want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
