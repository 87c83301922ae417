"""The mesh follows the hardware: JAX's topology-aware device mesh on one TPU slice, a hybrid
mesh with the slices on 'data' (else 'fsdp') across several, CPU order unchanged."""

import dataclasses
import itertools

import jax
import numpy as np
import pytest

from spade_jax.sharding import device_grid, make_mesh, slice_axes


@dataclasses.dataclass(frozen=True)
class FakeTpu:
    """What mesh_utils reads of a TPU device: its kind, torus coordinates and slice."""

    id: int
    coords: tuple[int, int, int]
    slice_index: int = 0
    core_on_chip: int = 0
    process_index: int = 0
    platform: str = "tpu"
    device_kind: str = "TPU v4"


def v4_slice(dims, slice_index=0, first_id=0):
    """The chips of a v4 slice with torus `dims` in jax.devices()' order."""
    coords = [(x, y, z) for z, y, x in itertools.product(*(range(d) for d in dims[::-1]))]
    return [FakeTpu(first_id + i, c, slice_index, process_index=first_id // 4 + i // 4)
            for i, c in enumerate(coords)]


def compact(group) -> bool:
    """The chips fill their bounding box in the torus (a sub-cuboid: all traffic on ICI links
    inside it)."""
    coords = np.asarray([d.coords for d in group])
    return int(np.prod(coords.max(0) - coords.min(0) + 1)) == len(group)


def test_cpu_mesh_uses_every_device_once_in_order():
    devices = jax.devices()
    mesh = make_mesh((2, 2, 2))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert mesh.devices.flatten().tolist() == devices  # single-host CPU: unchanged order
    assert make_mesh((1, 1, 1), devices[3:4]).devices.item() == devices[3]
    with pytest.raises(ValueError, match="needs 8 devices but 4"):
        make_mesh((2, 2, 2), devices[:4])


def test_one_tpu_slice_puts_each_tensor_group_on_a_sub_cuboid():
    """A v4-32 (2x2x4 chips): every device once, and each 'tensor' group of 4 (the most
    communicating axis) and each fsdp x tensor plane of 8 fills a compact block of the torus,
    whatever order the devices are listed in; a plain reshape of that order does not."""
    chips = v4_slice((2, 2, 4))
    scrambled = [chips[i] for i in np.random.default_rng(0).permutation(16)]
    grid = device_grid((2, 2, 4), scrambled)
    assert grid.shape == (2, 2, 4)
    assert sorted(d.id for d in grid.flat) == list(range(16))
    assert all(compact(group) for group in grid.reshape(-1, 4))
    assert all(compact(plane.flat) for plane in grid)
    reshaped = np.asarray(scrambled, dtype=object).reshape(-1, 4)
    assert not all(compact(group) for group in reshaped)
    assert (device_grid((2, 2, 4), chips) == grid).all()


@pytest.mark.parametrize(("shape", "across"), [((2, 4, 2), (2, 1, 1)), ((1, 8, 2), (1, 2, 1))])
def test_two_slices_split_over_data_else_fsdp(shape, across):
    """Two v4-16 slices (2x2x2 chips each): each slice fills one half of the axis that spans
    them, every device appears once and each 'tensor' pair is a linked pair of one slice,
    whatever order the devices are listed in."""
    chips = v4_slice((2, 2, 2), 0) + v4_slice((2, 2, 2), 1, first_id=8)
    assert slice_axes(shape, 2) == across
    grid = device_grid(shape, [chips[i] for i in np.random.default_rng(1).permutation(16)])
    assert grid.shape == shape
    assert sorted(d.id for d in grid.flat) == list(range(16))
    axis = across.index(2)
    halves = np.split(grid, 2, axis=axis)
    assert [{d.slice_index for d in half.flat} for half in halves] == [{0}, {1}]
    assert all(compact(pair) and pair[0].slice_index == pair[1].slice_index
               for pair in grid.reshape(-1, 2))


def test_slices_that_no_axis_divides_are_refused():
    with pytest.raises(ValueError, match=r"mesh \(1, 1, 16\) cannot be split over 2 slices"):
        slice_axes((1, 1, 16), 2)
