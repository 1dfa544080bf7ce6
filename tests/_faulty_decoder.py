"""A fake decoder child for tests/test_decode_process.py (named as such: a real FFmpeg crash cannot be made on
demand): the real child (``robot_rl.data.decode_process.child_main``) whose decoder faults after ``after`` frames
of each file whose path contains ``match``.

    python tests/_faulty_decoder.py <fault> <after> <match> <memory cap in bytes>

fault: "segv" (the process kills itself with SIGSEGV, as a crashing decoder would), "hang" (sleeps), "alloc"
(allocates 3 GiB, over the default 2 GiB cap), "exit" (exits with status 3), "chatter" (no fault: from then on,
prints to stdout through Python and through the file descriptor before every frame, as a noisy library would).
"""

from __future__ import annotations

import os
import signal
import sys
import time

from robot_rl.data import decode_process
from robot_rl.data.video_decode import matched_frames


def faulty_frames(fault: str, after: int, match: str):
    def frames(backend, targets, height, width, tolerance_s):
        for n, item in enumerate(matched_frames(backend, targets, height, width, tolerance_s)):
            if fault == "chatter" and n >= after and match in str(targets.path):
                print("decoder says hello", flush=True)
                os.write(1, b"and FFmpeg too\n")
            elif n == after and match in str(targets.path):
                if fault == "segv":
                    os.kill(os.getpid(), signal.SIGSEGV)
                elif fault == "hang":
                    time.sleep(3600)
                elif fault == "alloc":
                    bytearray(3 << 30)
                elif fault == "exit":
                    os._exit(3)
            yield item

    return frames


if __name__ == "__main__":
    decode_process.child_main(sys.argv[4:], frames=faulty_frames(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
