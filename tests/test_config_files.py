"""Honest config (issue 15, point 7): what the operator reads is what is in effect.

- UPDATE_BROKER_CONFIG changes at runtime only what the broker applies at
  runtime (brokerPermission); a request naming a setting read at start is
  refused whole (NO_PERMISSION, as RocketMQ refuses its configBlackList) with
  a remark naming every such setting, and GET_BROKER_CONFIG still shows the
  values in effect.
- A config table (topics.json, consumerOffset.json, …) that does not load
  falls back to its .bak with a WARNING naming both files; one that neither
  supplies stops the start with one line naming the file and the key.
"""
from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import orjson
import pytest
from brokerproc import BrokerProc, broker_conf
from shmq.client.remoting import RemotingClient
from shmq.client.requests import create_topic
from shmq.core.checkpoint import ConfigFileError, config_path, load_table, save_table
from shmq.core.files import REAL_FILES
from shmq.ipc.codes import RequestCode as RC
from shmq.ipc.codes import ResponseCode as R
from shmq.ipc.remoting import RemotingCommand


def update_config(c, **values):
    body = "".join(f"{k}={v}\n" for k, v in values.items()).encode()
    return c.invoke(RemotingCommand(RC.UPDATE_BROKER_CONFIG, body=body))


def broker_config(c) -> dict[str, str]:
    r = c.invoke(RemotingCommand(RC.GET_BROKER_CONFIG))
    assert r.code == R.SUCCESS, r.remark
    return dict(line.split("=", 1) for line in bytes(r.body).decode().splitlines())


def all_topics(c) -> dict:
    r = c.invoke(RemotingCommand(RC.GET_ALL_TOPIC_CONFIG))
    assert r.code == R.SUCCESS, r.remark
    return orjson.loads(r.body)["topicConfigTable"]


def topic_entry(name: str, read=4, write=4) -> dict:
    return {"topicName": name, "readQueueNums": read, "writeQueueNums": write, "perm": 6,
            "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": False}


def shmq_broker(conf_path: str):
    return subprocess.run([sys.executable, "-m", "shmq.tools", "broker", "-c", conf_path],
                          capture_output=True, text=True, timeout=120)


# ------------------------------------------------------ UPDATE_BROKER_CONFIG
def test_restart_only_settings_are_refused_by_name_and_nothing_changes(tmp_path):
    conf = broker_conf(tmp_path)
    store = conf["storePathRootDir"]
    with BrokerProc(tmp_path, conf).start() as b, RemotingClient(b.addr) as c:
        before = broker_config(c)
        assert before["listenPort"] == conf["listenPort"] and before["brokerPermission"] == "6"

        r = update_config(c, listenPort=1, storePathRootDir=str(tmp_path / "elsewhere"),
                          flushDiskType="SYNC_FLUSH", bindAddress="0.0.0.0", brokerPermission=4)
        assert r.code == R.NO_PERMISSION
        assert r.remark.startswith("bindAddress, flushDiskType, listenPort, storePathRootDir "
                                   "need a restart: change broker.conf"), r.remark
        assert "brokerPermission" in r.remark     # what can change at runtime
        assert broker_config(c) == before          # nothing of that request, not even brokerPermission

        r = update_config(c, fileReservedTime=1)
        assert (r.code, r.remark.split(":")[0]) == (R.NO_PERMISSION, "fileReservedTime needs a restart")
        # the value in effect, or a runtime setting: accepted
        assert update_config(c, listenPort=conf["listenPort"]).code == R.SUCCESS
        assert update_config(c, brokerPermission=4).code == R.SUCCESS
        assert broker_config(c) == {**before, "brokerPermission": "4"}
        assert update_config(c, brokerPermission=6).code == R.SUCCESS
    kept = load_table(REAL_FILES, store, "brokerConfig.json")["brokerConfigTable"]
    assert kept == {"brokerPermission": "6"}


def test_settings_an_older_shmq_kept_are_not_reported_and_a_warning_names_them(tmp_path):
    conf = broker_conf(tmp_path)
    store = conf["storePathRootDir"]
    os.makedirs(os.path.join(store, "config"))
    save_table(REAL_FILES, store, "brokerConfig.json", {"brokerConfigTable": {
        "listenPort": "1", "fileReservedTime": "1", "brokerPermission": "4"}})
    with BrokerProc(tmp_path, conf).start() as b, RemotingClient(b.addr) as c:
        cfg = broker_config(c)
        assert (cfg["listenPort"], cfg["fileReservedTime"], cfg["brokerPermission"]) == \
            (conf["listenPort"], "72", "4")      # the values in effect
        warning = [line for line in b.log().splitlines() if "WARNING" in line
                   and "brokerConfig.json" in line]
        assert warning and "fileReservedTime=1, listenPort=1 not applied" in warning[0], b.log()
        assert update_config(c, brokerPermission=6).code == R.SUCCESS
    assert load_table(REAL_FILES, store, "brokerConfig.json")["brokerConfigTable"] == \
        {"brokerPermission": "6"}


# ------------------------------------------------------------- config tables
def test_a_garbage_topics_json_falls_back_to_its_bak_with_a_warning(tmp_path):
    conf = broker_conf(tmp_path)
    store = conf["storePathRootDir"]
    path = config_path(store, "topics.json")
    with BrokerProc(tmp_path, conf).start() as b, RemotingClient(b.addr) as c:
        assert c.invoke(create_topic("CfgKept", 3)).code == R.SUCCESS
        assert c.invoke(create_topic("CfgLast", 2)).code == R.SUCCESS
    with open(path + ".bak") as f:
        assert "CfgKept" in json.load(f)["topicConfigTable"]
    with open(path, "w") as f:
        f.write('{"topicConfigTable": {"CfgLast": {')      # a torn write
    with BrokerProc(tmp_path, conf).start() as b, RemotingClient(b.addr) as c:
        topics = all_topics(c)
        assert topics["CfgKept"]["readQueueNums"] == 3
        warnings = [line for line in b.log().splitlines() if " WARNING " in line and path in line]
        assert warnings, b.log()
        assert f"config file {path} is not valid JSON" in warnings[0]
        assert f"loaded {path}.bak instead" in warnings[0]


def test_a_wrong_shaped_topics_json_without_a_good_bak_is_one_line_naming_file_and_key(tmp_path):
    conf = broker_conf(tmp_path)
    path = config_path(conf["storePathRootDir"], "topics.json")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        json.dump({"topicConfigTable": {"CfgBad": {**topic_entry("CfgBad"), "readQueueNums": "x"}}}, f)
    proc = BrokerProc(tmp_path, conf)      # writes broker.conf
    r = shmq_broker(proc.conf_path)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "invalid literal" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last == (f'shmq broker: config file {path}: topicConfigTable.CfgBad.readQueueNums '
                    f'is "x", not an integer'), r.stderr
    # a garbage .bak beside it: both named, on the same one line
    with open(path + ".bak", "w") as f:
        f.write("garbage")
    r = shmq_broker(proc.conf_path)
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert last.startswith(f"shmq broker: config file {path}: topicConfigTable.CfgBad") and \
        f"config file {path}.bak is not valid JSON" in last, r.stderr
    assert not os.path.exists(os.path.join(conf["storePathRootDir"], "abort"))


# ------------------------------------------- every table's shape, unit level
@pytest.mark.parametrize("name, data, says", [
    ("topics.json", {"topicConfigTable": {"T": {**topic_entry("T"), "perm": "6"}}},
     'topicConfigTable.T.perm is "6", not an integer'),
    ("topics.json", {"topicConfigTable": {"T": {"topicName": "T", "perm": 6, "writeQueueNums": 1}}},
     "topicConfigTable.T.readQueueNums is missing"),
    ("topics.json", {"topicConfigTable": []}, "topicConfigTable is [], not a JSON object"),
    ("subscriptionGroup.json", {"subscriptionGroupTable": {"g": {"retryMaxTimes": "16"}}},
     'subscriptionGroupTable.g.retryMaxTimes is "16", not an integer'),
    ("consumerOffset.json", {"offsetTable": {"T@g": {"zero": 5}}},
     'offsetTable.T@g.zero: the key "zero" is not an integer'),
    ("consumerOffset.json", {"offsetTable": {"T@g": {"0": "5"}}},
     'offsetTable.T@g.0 is "5", not an integer'),
    ("delayOffset.json", {"offsetTable": {"1": 3.5}}, "offsetTable.1 is 3.5, not an integer"),
    ("brokerConfig.json", {"brokerConfigTable": {"brokerPermission": "rw"}},
     'brokerConfigTable.brokerPermission is "rw", not an integer string'),
    ("topics.json", {"dataVersion": {"counter": "1"}, "topicConfigTable": {}},
     'dataVersion.counter is "1", not an integer'),
])
def test_a_wrong_shaped_table_names_its_file_and_key(store_dir, name, data, says):
    path = config_path(store_dir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)
    with pytest.raises(ConfigFileError) as e:
        load_table(REAL_FILES, store_dir, name)
    assert str(e.value) == f"config file {path}: {says}"


def test_a_wrong_shaped_table_with_a_good_bak_loads_the_bak_and_warns_once(store_dir, caplog):
    good = {"offsetTable": {"T@g": {"0": 7}}}
    save_table(REAL_FILES, store_dir, "consumerOffset.json", good)
    save_table(REAL_FILES, store_dir, "consumerOffset.json", good)
    path = config_path(store_dir, "consumerOffset.json")
    with open(path, "w") as f:
        json.dump({"offsetTable": {"T@g": {"0": "8"}}}, f)
    with caplog.at_level(logging.WARNING, logger="shmq.config"):
        for _ in range(3):
            assert load_table(REAL_FILES, store_dir, "consumerOffset.json")["offsetTable"] == \
                good["offsetTable"]
    [rec] = [r for r in caplog.records if path in r.getMessage()]
    assert rec.levelname == "WARNING"
    assert rec.getMessage() == (f'config file {path}: offsetTable.T@g.0 is "8", not an integer; '
                                f"loaded {path}.bak instead (the last change to "
                                f"consumerOffset.json may be lost)")


# ------------------------------------------- entries: frozen configs over the files
def test_topic_and_group_entries_carry_the_fields_the_file_check_knows():
    """The table files are checked by ``core.checkpoint``'s field lists and
    read into ``broker.topics``' frozen entries: the two agree, field for field."""
    from shmq.broker.topics import GroupConfig, TopicConfig
    from shmq.core.checkpoint import _GROUP_FIELDS, _TOPIC_FIELDS
    assert set(TopicConfig._KEYS.values()) == set(_TOPIC_FIELDS)
    assert set(GroupConfig._KEYS.values()) == set(_GROUP_FIELDS)


def test_a_topic_entry_round_trips_through_its_file_and_admin_bodies_keep_defaults():
    from shmq.broker.topics import GroupConfig, TopicConfig, topic_config
    tc = topic_config("T", 3, 5, 4, "MULTI_TAG", 1, True)
    assert TopicConfig.from_json("T", json.loads(json.dumps(tc.to_json()))) == tc
    assert tc.to_json() == {"topicName": "T", "readQueueNums": 3, "writeQueueNums": 5, "perm": 4,
                            "topicFilterType": "MULTI_TAG", "topicSysFlag": 1, "order": True}
    with pytest.raises(AttributeError):
        tc.perm = 6                                     # frozen: a change goes through the table
    # an UPDATE_AND_CREATE_SUBSCRIPTIONGROUP body: wrong types and unknown keys keep defaults
    g = GroupConfig.from_json("G", {"retryMaxTimes": 3, "consumeEnable": "no", "brokerId": True,
                                    "attributes": {}})
    assert (g.retry_max_times, g.consume_enable, g.broker_id) == (3, True, 0)


def test_a_permission_or_retention_that_is_none_is_refused_at_start_naming_it(tmp_path):
    """broker.conf's brokerPermission=99 and fileReservedTime=-1 were taken
    (a negative retention would keep no file): each is one clear error."""
    from shmq.broker.config import BrokerConfig, load
    for line, says in (("brokerPermission=99", "brokerPermission=99: a permission, 0..15"),
                       ("fileReservedTime=-1", "fileReservedTime=-1: hours a CommitLog file is "
                                               "kept, must be >= 0")):
        conf = tmp_path / "broker.conf"
        conf.write_text(f"storePathRootDir={tmp_path / 'store'}\n{line}\n")
        with pytest.raises(ValueError, match=re.escape(says)):
            load(str(conf))
    assert BrokerConfig.from_strings({"brokerPermission": "4", "fileReservedTime": "0"})[0] \
        .brokerPermission == 4
