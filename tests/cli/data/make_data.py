"""make_data.py - writes the golden .npy files in this folder with numpy's own
writer, so the C reader is tested on what numpy really produces (the tests do
not need numpy: the files are committed). Rerun by hand:
    python3 tests/cli/data/make_data.py   (numpy >= 1.24 for the header spaces)
Every array holds arange(n) * 0.5 - 1 in its dtype, so tests/cli/test_npy.c
can check the data without numpy."""
import os
import numpy as np
from numpy.lib import format as npf

HERE = os.path.dirname(os.path.abspath(__file__))


def values(shape, dtype):
    n = int(np.prod(shape)) if shape else 1
    return (np.arange(n, dtype=np.float64) * 0.5 - 1).astype(dtype).reshape(shape)


def save(name, arr, version=None, allow_pickle=False):
    with open(os.path.join(HERE, name), "wb") as f:
        if version is None:
            np.save(f, arr, allow_pickle=allow_pickle)
        else:
            npf.write_array(f, arr, version=version, allow_pickle=allow_pickle)


# accepted: every dtype, every format version, 0-d, 1-d, empty, 3-d
save("f4_2x3.npy", values((2, 3), "<f4"))
save("f2_2x3.npy", values((2, 3), "<f2"))
save("f8_2x3.npy", values((2, 3), "<f8"))
bf16_bits = (values((2, 3), "<f4").view("<u4") >> 16).astype("<u2")
save("u2_2x3.npy", bf16_bits)
save("f4_2x3_v2.npy", values((2, 3), "<f4"), version=(2, 0))
save("f4_2x3_v3.npy", values((2, 3), "<f4"), version=(3, 0))
save("f8_scalar.npy", values((), "<f8"))
save("f4_5.npy", values((5,), "<f4"))
save("f4_0x4.npy", values((0, 4), "<f4"))
save("f2_2x3x4.npy", values((2, 3, 4), "<f2"))
# rejected, each with its own message
save("fortran_2x3.npy", np.asfortranarray(values((2, 3), "<f4")))
save("be_f4_2x3.npy", values((2, 3), ">f4"))
save("i4_2x3.npy", values((2, 3), "<i4"))
save("object_2.npy", np.array([1, "a"], dtype=object), allow_pickle=True)
save("struct_2.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i2")]))
