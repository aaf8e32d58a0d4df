import os
import re

from tiergate.router.request import ids as request_ids
from tiergate.router.request.ids import new_request_id


def test_ids_are_32_hex_digits_and_distinct():
    ids = [new_request_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_its_own_prefix():
    parent = new_request_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave without running pytest's teardown
        os.write(write, new_request_id().encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert child[:16] != parent[:16]
    assert new_request_id()[:16] == parent[:16]


def test_a_new_process_prefix_differs():
    before = new_request_id()
    request_ids._draw()  # what a restart does
    after = new_request_id()
    assert before[:16] != after[:16]
    assert after.endswith("1".rjust(16, "0"))
