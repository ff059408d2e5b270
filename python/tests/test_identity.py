"""One Python object per tensor (Note [One Python object per tensor] in
python/src/tensor_caster.h): the same tensor comes back as the same object, so `is`, dict keys
and sets work as in PyTorch; a wrapper that dies is forgotten, and the tensor gets a working
new one."""
import gc
import threading

import kiln


def test_a_gradient_is_one_object():
    w = kiln.randn(3, requires_grad=True)
    (w * w).sum().backward()
    assert w.grad is w.grad
    assert w.grad.tolist() == (w * 2).detach().tolist()


def test_parameters_work_as_dict_keys_and_set_members():
    m = kiln.nn.Linear(4, 3)
    state = {p: i for i, p in enumerate(m.parameters())}
    for i, p in enumerate(m.parameters()):
        assert state[p] == i
    assert len(set(m.parameters()) | set(m.parameters())) == 2
    assert m.weight is m.parameters()[0] or m.weight is m.parameters()[1]


def test_in_place_ops_return_the_same_object():
    a = kiln.zeros(3)
    assert a.add_(1) is a
    assert a.mul_(2) is a
    before = a
    a += 1
    a -= 2
    assert a is before and a.tolist() == [1.0, 1.0, 1.0]
    out = kiln.empty(3)
    assert kiln.add(a, a, out=out) is out


def test_new_tensors_views_and_aliases_are_new_objects():
    a = kiln.ones(2, 3)
    assert a.view(6) is not a and a.detach() is not a and a.clone() is not a
    assert a + 0 is not a
    assert a[0] is not a[0]  # indexing makes a new view each time, as in PyTorch


def test_a_dead_wrapper_is_forgotten_and_the_tensor_wrapped_again():
    m = kiln.nn.Linear(2, 2)
    w = m.weight
    values = w.tolist()
    del w
    gc.collect()
    # Objects made in between may reuse the dead wrapper's memory; the next wrapper must be a
    # live, working one, whatever its id.
    junk = [kiln.zeros(1) for _ in range(8)]
    again = m.weight
    assert again.tolist() == values and again.shape == (2, 2)
    assert again is m.weight
    assert all(j.tolist() == [0.0] for j in junk)
    del again
    gc.collect()
    assert m.weight.tolist() == values


def test_wrappers_come_and_go_while_cpp_keeps_the_tensors():
    # Wrappers dropped and made again among many short-lived ones: every lookup gives a live
    # object with the tensor's values, the same one while it lives.
    m = kiln.nn.Linear(8, 8)
    want = [p.tolist() for p in m.parameters()]
    for i in range(50):
        ps = m.parameters()
        assert ps[0] is m.parameters()[0] and ps[1] is m.parameters()[1]
        assert [p.tolist() for p in ps] == want
        del ps
        churn = [kiln.ones(3) + j for j in range(i % 7 + 1)]
        assert churn[-1].tolist() == [float(i % 7 + 1)] * 3
        del churn
        gc.collect()


def test_threads_returning_one_tensor():
    m = kiln.nn.Linear(3, 3)
    seen = []

    def work():
        for _ in range(200):
            seen.append(m.parameters()[0])  # a list the C++ module makes on each call

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(s is seen[0] for s in seen)
