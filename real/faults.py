"""Fault injection for tests of the real-robot path: a simulated STS3215 servo chain behind LeRobot's own
``FeetechMotorsBus``, and a fault wrapper for any LeRobot ``Robot`` (RELIABILITY.md A1-A7).

``FaultBus`` is LeRobot's ``FeetechMotorsBus`` with the serial port, packet handler and sync reader/writer replaced by
``SimulatedServos``: everything LeRobot does above the wire (normalisation, ``_unnormalize``'s rounding,
sign-magnitude encoding, byte splitting, retries, ``disable_torque``'s loop) runs unchanged, and the servos see the
bytes a real chain would. They keep a register file per motor, move ``Present_Position`` toward ``Goal_Position``
while torque is on (a stale goal register moves the arm the moment torque comes on, as on a real servo), and record
every raw ``Goal_Position`` tick and every ``Torque_Enable`` write:

    robot = SO101Follower(SO101FollowerConfig(port="/dev/sim", id="arm", calibration_dir=d))
    bus = install_fault_bus(robot, FaultPlan(read_error_rate=0.01, nack_ids=(3,)))
    robot.connect(calibrate=False)   # or real.robot_env.safe_connect(robot)
    bus.servos.goal_ticks             # [(tick, {id: raw}), ...] every Goal_Position sync write
    bus.servos.torque_writes          # [(monotonic s, id, value, applied), ...]

Faults (``FaultPlan``): transient read errors (a corrupted status packet, at a rate), motors that NACK every
acknowledged write, a connection dropped from a given tick on (a pulled cable), over-temperature readings (a ramp),
and a stall (a transaction that sleeps). A tick is one ``Goal_Position`` sync write (one control step).

``FaultyRobot`` wraps any ``Robot`` (``so101_sim`` included): failing state or camera reads, a disconnect from a
tick, a stalled ``get_observation``, and a record of every action sent and torque-off request.
"""

from __future__ import annotations

import errno
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lerobot.motors import Motor, MotorCalibration
from lerobot.motors.feetech import FeetechMotorsBus
from lerobot.motors.feetech.tables import MODEL_CONTROL_TABLE, MODEL_NUMBER_TABLE

COMM_SUCCESS, COMM_TX_FAIL, COMM_RX_TIMEOUT, COMM_RX_CORRUPT = 0, -2, -6, -7
_TABLE = MODEL_CONTROL_TABLE["sts3215"]
ADDR = {name: addr for name, (addr, _) in _TABLE.items()}
_NAME_AT = {addr: name for name, (addr, _) in _TABLE.items()}
FIRMWARE = (3, 10)


@dataclass
class FaultPlan:
    """What goes wrong on the simulated bus (everything off by default)."""

    read_error_rate: float = 0.0  # probability that a read transaction returns a corrupted status packet
    nack_ids: tuple[int, ...] = ()  # motor ids whose writes all fail (no status packet; sync writes ignored)
    fail_latency_s: float = 0.002  # s a failed transaction takes (at most the port's packet timeout)
    drop_from_tick: int | None = None  # from this Goal_Position tick on, nothing answers (a pulled USB cable)
    # How the dropped connection shows: False, no status packet (a cut bus wire: LeRobot raises ConnectionError);
    # True, the port itself raises OSError EIO on every transaction (the USB adapter unplugged: pyserial's
    # SerialException is an OSError)
    drop_raises_os_error: bool = False
    temperature_c: float = 35.0  # Present_Temperature at tick 0, degC
    temperature_per_tick: float = 0.0  # degC added per tick (an over-temperature ramp)
    stall_at_tick: int | None = None  # the Goal_Position write of this tick sleeps stall_s (a stalled loop)
    stall_s: float = 0.0
    port_present: bool = True  # False: opening the port fails (a wrong port= / unplugged adapter)
    seed: int = 0


class SimulatedServos:
    """The register files of a chain of STS3215 servos, their motion, and the record of what was written.

    Args:
        motors: LeRobot's motors (name -> ``Motor``) of the bus.
        calibration: written into the EEPROM registers (so ``is_calibrated`` holds); None: full range, no offset.
        plan: the faults.
        start_ticks: raw present position per motor id (default: the middle of each range).
        stale_goal_ticks: raw Goal_Position register per id at power-on (default: the present position).
        follow: fraction of the goal-present gap closed per read while torque is on (1: instant).
        log_path: if set, every torque write and goal tick is appended there as a JSON line (for tests that kill
            the process).
    """

    def __init__(self, motors: dict[str, Motor], calibration: dict[str, MotorCalibration] | None = None,
                 plan: FaultPlan | None = None, start_ticks: dict[int, int] | None = None,
                 stale_goal_ticks: dict[int, int] | None = None, follow: float = 0.5,
                 log_path: str | Path | None = None) -> None:
        self.plan = plan or FaultPlan()
        self.rng = random.Random(self.plan.seed)
        self.ids = {m.id: name for name, m in motors.items()}
        self.follow = follow
        self.regs: dict[int, bytearray] = {}
        self.tick = 0
        self.goal_ticks: list[tuple[int, dict[int, int]]] = []
        self.torque_writes: list[tuple[float, int, int, bool]] = []
        self.events: list[tuple[float, str, int, int]] = []  # (monotonic s, register name, id, value)
        self.read_failures = self.write_failures = self.attempts_after_drop = 0
        self.log_path = Path(log_path) if log_path else None
        self.lock = threading.Lock()
        self._stalled = False
        for id_, name in self.ids.items():
            r = bytearray(128)
            cal = (calibration or {}).get(name)
            mn, mx, off = (cal.range_min, cal.range_max, cal.homing_offset) if cal else (0, 4095, 0)
            self._put(r, "Model_Number", MODEL_NUMBER_TABLE["sts3215"])
            r[ADDR["Firmware_Major_Version"]], r[ADDR["Firmware_Minor_Version"]] = FIRMWARE
            self._put(r, "ID", id_)
            self._put(r, "Min_Position_Limit", mn)
            self._put(r, "Max_Position_Limit", mx)
            self._put(r, "Homing_Offset", _sign_mag(off, 11))
            start = (start_ticks or {}).get(id_, (mn + mx) // 2)
            self._put(r, "Present_Position", start)
            self._put(r, "Goal_Position", (stale_goal_ticks or {}).get(id_, start))
            self.regs[id_] = r

    # ------------------------------------------------------------------------------------------- registers
    @staticmethod
    def _put(r: bytearray, name: str, value: int) -> None:
        addr, length = _TABLE[name]
        r[addr:addr + length] = int(value).to_bytes(length, "little")

    def get(self, id_: int, name: str) -> int:
        addr, length = _TABLE[name]
        return int.from_bytes(self.regs[id_][addr:addr + length], "little")

    def torque_on(self, id_: int) -> bool:
        return self.regs[id_][ADDR["Torque_Enable"]] == 1

    def present(self, id_: int) -> int:
        return self.get(id_, "Present_Position")

    # ------------------------------------------------------------------------------------------- faults
    def dropped(self) -> bool:
        return self.plan.drop_from_tick is not None and self.tick >= self.plan.drop_from_tick

    def _gone(self) -> None:
        """Count a transaction on the dropped connection; raise as the unplugged port does, if the plan says so."""
        self.attempts_after_drop += 1
        if self.plan.drop_raises_os_error:
            raise OSError(errno.EIO, "Input/output error (simulated: the USB adapter was unplugged)")

    def _fail(self, port: Any) -> None:
        timeout_s = getattr(port, "timeout_ms", 1000.0) / 1e3
        time.sleep(min(self.plan.fail_latency_s, timeout_s))

    def _log(self, kind: str, **values: Any) -> None:
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(json.dumps({"t": time.monotonic(), "kind": kind, **values}) + "\n")
                f.flush()

    # ------------------------------------------------------------------------------------------- motion
    def _move(self, id_: int) -> None:
        if not self.torque_on(id_):
            return
        goal, now = _sign_mag_decode(self.get(id_, "Goal_Position"), 15), self.present(id_)
        step = round(self.follow * (goal - now)) if self.follow < 1 else goal - now
        self._put(self.regs[id_], "Present_Position", max(0, min(4095, now + step)))

    def _temperature(self) -> int:
        return int(max(0, min(255, self.plan.temperature_c + self.plan.temperature_per_tick * self.tick)))

    # ------------------------------------------------------------------------------------------- transactions
    def read(self, port: Any, id_: int, addr: int, length: int) -> tuple[int, int, int]:
        with self.lock:
            if id_ not in self.regs:
                return 0, COMM_RX_TIMEOUT, 0
            if self.dropped():
                self._gone()
                self._fail(port)
                return 0, COMM_RX_TIMEOUT, 0
            if self.plan.read_error_rate and self.rng.random() < self.plan.read_error_rate:
                self.read_failures += 1
                return 0, COMM_RX_CORRUPT, 0
            return self._value(id_, addr, length), COMM_SUCCESS, 0

    def _value(self, id_: int, addr: int, length: int) -> int:
        if addr == ADDR["Present_Position"]:
            self._move(id_)
        if addr == ADDR["Present_Temperature"]:
            self.regs[id_][addr] = self._temperature()
        return int.from_bytes(self.regs[id_][addr:addr + length], "little")

    def write(self, port: Any, id_: int, addr: int, length: int, data: list[int], acked: bool = True) -> int:
        with self.lock:
            if id_ not in self.regs:
                return COMM_RX_TIMEOUT
            value = int.from_bytes(bytes(data), "little")
            fail = self.dropped() or id_ in self.plan.nack_ids
            if addr == ADDR["Torque_Enable"]:
                self.torque_writes.append((time.monotonic(), id_, value, not fail))
                self._log("torque", id=id_, value=value, applied=not fail)
            if fail:
                self.write_failures += 1
                if self.dropped() and acked:  # (unacked: a motor's share of a sync write, the packet already sent)
                    self._gone()
                if acked:
                    self._fail(port)
                return COMM_RX_TIMEOUT if acked else COMM_SUCCESS
            self.regs[id_][addr:addr + length] = bytes(data)
            self.events.append((time.monotonic(), _NAME_AT.get(addr, str(addr)), id_, value))
            return COMM_SUCCESS

    def sync_read(self, port: Any, ids: list[int], addr: int, length: int) -> tuple[int, dict[int, int]]:
        with self.lock:
            if self.dropped():
                self._gone()
                self._fail(port)
                return COMM_RX_TIMEOUT, {}
            if self.plan.read_error_rate and self.rng.random() < self.plan.read_error_rate:
                self.read_failures += 1
                return COMM_RX_CORRUPT, {}
            if any(i not in self.regs for i in ids):
                return COMM_RX_TIMEOUT, {}
            return COMM_SUCCESS, {i: self._value(i, addr, length) for i in ids}

    def sync_write(self, port: Any, addr: int, length: int, params: dict[int, list[int]]) -> int:
        goal = addr == ADDR["Goal_Position"]
        if goal and self.plan.stall_at_tick is not None and self.tick == self.plan.stall_at_tick \
                and not self._stalled:
            self._stalled = True
            time.sleep(self.plan.stall_s)
        with self.lock:
            if self.dropped():
                self._gone()
                return COMM_TX_FAIL
            if goal:
                raw = {i: _sign_mag_decode(int.from_bytes(bytes(d), "little"), 15) for i, d in params.items()}
                self.goal_ticks.append((self.tick, raw))
                self._log("goal", tick=self.tick, raw=raw)
                self.tick += 1
        for i, d in params.items():
            self.write(port, i, addr, length, d, acked=False)
        return COMM_SUCCESS


def _sign_mag(value: int, bit: int) -> int:
    return (abs(value) | (1 << bit)) if value < 0 else value


def _sign_mag_decode(value: int, bit: int) -> int:
    return -(value & ((1 << bit) - 1)) if value & (1 << bit) else value


# ------------------------------------------------------------------------------------------------ SDK doubles
class _SimPort:
    """scservo_sdk's PortHandler, as LeRobot's bus uses it."""

    def __init__(self, servos: SimulatedServos, port_name: str) -> None:
        self.servos, self.port_name = servos, port_name
        self.is_open = self.is_using = False
        self.baudrate, self.timeout_ms = 1_000_000, 1000.0

    def openPort(self) -> bool:
        self.is_open = bool(self.servos.plan.port_present)
        return self.is_open

    def closePort(self) -> None:
        self.is_open = False

    def clearPort(self) -> None:
        pass

    def setPacketTimeoutMillis(self, msec: float) -> None:
        self.timeout_ms = float(msec)

    def getBaudRate(self) -> int:
        return self.baudrate

    def setBaudRate(self, baudrate: int) -> bool:
        self.baudrate = baudrate
        return True


class _SimPacketHandler:
    def __init__(self, servos: SimulatedServos) -> None:
        self.servos = servos

    def ping(self, port: Any, id_: int) -> tuple[int, int, int]:
        value, comm, err = self.servos.read(port, id_, ADDR["Model_Number"], 2)
        return value, comm, err

    def read1ByteTxRx(self, port: Any, id_: int, addr: int) -> tuple[int, int, int]:
        return self.servos.read(port, id_, addr, 1)

    def read2ByteTxRx(self, port: Any, id_: int, addr: int) -> tuple[int, int, int]:
        return self.servos.read(port, id_, addr, 2)

    def read4ByteTxRx(self, port: Any, id_: int, addr: int) -> tuple[int, int, int]:
        return self.servos.read(port, id_, addr, 4)

    def writeTxRx(self, port: Any, id_: int, addr: int, length: int, data: list[int]) -> tuple[int, int]:
        return self.servos.write(port, id_, addr, length, data), 0

    @staticmethod
    def getTxRxResult(comm: int) -> str:
        return {COMM_SUCCESS: "[TxRxResult] Communication success!",
                COMM_TX_FAIL: "[TxRxResult] Failed transmit instruction packet!",
                COMM_RX_TIMEOUT: "[TxRxResult] There is no status packet!",
                COMM_RX_CORRUPT: "[TxRxResult] Incorrect status packet!"}.get(comm, f"[TxRxResult] error {comm}")

    @staticmethod
    def getRxPacketError(error: int) -> str:
        return f"[RxPacketError] status {error:#x}"


class _SimSyncRead:
    def __init__(self, servos: SimulatedServos, port: _SimPort) -> None:
        self.servos, self.port = servos, port
        self.start_address = self.data_length = 0
        self.ids: list[int] = []
        self.data: dict[int, int] = {}

    def clearParam(self) -> None:
        self.ids = []

    def addParam(self, id_: int) -> bool:
        self.ids.append(id_)
        return True

    def txRxPacket(self) -> int:
        comm, self.data = self.servos.sync_read(self.port, self.ids, self.start_address, self.data_length)
        return comm

    def getData(self, id_: int, addr: int, length: int) -> int:
        return self.data.get(id_, 0)


class _SimSyncWrite:
    def __init__(self, servos: SimulatedServos, port: _SimPort) -> None:
        self.servos, self.port = servos, port
        self.start_address = self.data_length = 0
        self.params: dict[int, list[int]] = {}

    def clearParam(self) -> None:
        self.params = {}

    def addParam(self, id_: int, data: list[int]) -> bool:
        self.params[id_] = list(data)
        return True

    def txPacket(self) -> int:
        return self.servos.sync_write(self.port, self.start_address, self.data_length, self.params)


class FaultBus(FeetechMotorsBus):
    """LeRobot's ``FeetechMotorsBus`` over ``SimulatedServos`` instead of a serial port (see the module docstring).

    Args:
        port, motors, calibration: as ``FeetechMotorsBus``.
        servos: the simulated chain (default: one built from ``motors``, ``calibration`` and ``plan``).
        plan: the faults of a default chain.
    """

    def __init__(self, port: str, motors: dict[str, Motor], calibration: dict[str, MotorCalibration] | None = None,
                 servos: SimulatedServos | None = None, plan: FaultPlan | None = None, **servo_kwargs: Any) -> None:
        super().__init__(port, motors, calibration)
        self.servos = servos or SimulatedServos(motors, calibration, plan, **servo_kwargs)
        self.port_handler = _SimPort(self.servos, port)
        self.packet_handler = _SimPacketHandler(self.servos)
        self.sync_reader = _SimSyncRead(self.servos, self.port_handler)
        self.sync_writer = _SimSyncWrite(self.servos, self.port_handler)


def install_fault_bus(robot: Any, plan: FaultPlan | None = None, **servo_kwargs: Any) -> FaultBus:
    """Replace a LeRobot follower's serial bus (``robot.bus``) by a ``FaultBus`` with the same motors and calibration;
    returns it. Call before ``connect``."""
    old = robot.bus
    bus = FaultBus(old.port, old.motors, old.calibration, plan=plan, **servo_kwargs)
    robot.bus = bus
    return bus


# ------------------------------------------------------------------------------------------------ any Robot
@dataclass
class RobotFaults:
    """What goes wrong around any ``Robot`` (``FaultyRobot``); a tick is one ``get_observation`` call."""

    read_error_rate: float = 0.0  # get_observation raises ConnectionError with this probability
    camera_error_at_tick: int | None = None  # get_observation raises TimeoutError (a camera read) from this tick on
    disconnect_at_tick: int | None = None  # from this tick on every call raises ConnectionError
    stall_at_tick: int | None = None  # get_observation of this tick sleeps stall_s first
    stall_s: float = 0.0
    raise_at_tick: dict[int, BaseException] = field(default_factory=dict)  # raise this exception at that tick
    seed: int = 0


class FaultyRobot:
    """A ``Robot`` with injected faults, delegating everything else to the wrapped one (``bus``, features,
    ``connect``, ...). Records ``sent`` (every action dict passed to ``send_action``) and ``torque_offs``
    (monotonic times of ``disable_torque`` calls)."""

    def __init__(self, robot: Any, faults: RobotFaults | None = None,
                 on_tick: Callable[[int], None] | None = None) -> None:
        self.robot, self.faults = robot, faults or RobotFaults()
        self.rng = random.Random(self.faults.seed)
        self.ticks = 0
        self.sent: list[dict[str, float]] = []
        self.torque_offs: list[float] = []
        self.on_tick = on_tick

    def __getattr__(self, name: str) -> Any:
        return getattr(self.robot, name)

    def get_observation(self) -> dict[str, Any]:
        t, f = self.ticks, self.faults
        self.ticks += 1
        if self.on_tick is not None:
            self.on_tick(t)
        if t in f.raise_at_tick:
            raise f.raise_at_tick[t]
        if f.disconnect_at_tick is not None and t >= f.disconnect_at_tick:
            raise ConnectionError(f"injected: the robot stopped answering at tick {f.disconnect_at_tick}")
        if f.stall_at_tick is not None and t == f.stall_at_tick:
            time.sleep(f.stall_s)
        if f.camera_error_at_tick is not None and t >= f.camera_error_at_tick:
            raise TimeoutError(f"injected: camera read timed out at tick {t}")
        if f.read_error_rate and self.rng.random() < f.read_error_rate:
            raise ConnectionError("injected: Incorrect status packet")
        return self.robot.get_observation()

    def send_action(self, action: dict[str, float]) -> dict[str, float]:
        f = self.faults
        if f.disconnect_at_tick is not None and self.ticks > f.disconnect_at_tick:
            raise ConnectionError("injected: the robot stopped answering")
        self.sent.append(dict(action))
        return self.robot.send_action(action)

    def disable_torque(self) -> None:
        self.torque_offs.append(time.monotonic())
        inner = getattr(self.robot, "disable_torque", None)
        if inner is not None:
            inner()


__all__ = ["FaultBus", "FaultPlan", "FaultyRobot", "RobotFaults", "SimulatedServos", "install_fault_bus"]
