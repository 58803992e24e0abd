import gc

from sunnypilot.modeld_v2.daemon import messaging

def test_set_fields_resolves_shared_parents_and_skips_under_a_missing_one():
  """Paths under one parent all land in it; every path under a parent this schema lacks is skipped by its full name; the result reads back
  as the same fields set one by one."""
  msg, ref = messaging.new_message("modelV2"), messaging.new_message("modelV2")
  values = {"meta.disengagePredictions.t": [1.0, 2.0], "meta.disengagePredictions.gasDisengageProbs": [0.5], "meta.engagedProb": 0.25,
            "nope.deeper.x": 1, "nope.other": 2, "position": {"x": [3.0], "y": [4.0]}, "frameId": 7}
  assert messaging.set_fields(msg.modelV2, values) == ["nope.deeper.x", "nope.other"]
  m = ref.modelV2
  m.meta.disengagePredictions.t, m.meta.disengagePredictions.gasDisengageProbs, m.meta.engagedProb = [1.0, 2.0], [0.5], 0.25
  m.position.x, m.position.y, m.frameId = [3.0], [4.0], 7
  ref.logMonoTime = msg.logMonoTime
  assert msg.to_bytes() == ref.to_bytes()

def test_set_fields_makes_no_reference_cycles():
  """modeld runs with the garbage collector off (openpilot's config_realtime_process): a message built through set_fields every frame
  (the pycapnp path, where no byte template fits) must leave nothing that only the collector could free."""
  values = {"frameId": 1, "meta.engagedProb": 0.5, "position.x": [1.0, 2.0], "leadsV3": [{"x": [1.0]}], "noSuchStruct.x": 1}
  messaging.set_fields(messaging.new_message("modelV2").modelV2, values)
  gc.collect()
  gc.disable()
  try:
    for _ in range(10): messaging.set_fields(messaging.new_message("modelV2").modelV2, values)
    assert gc.collect() == 0
  finally: gc.enable()

def test_a_kept_message_outlives_its_bytes(openpilot_prefix):
  """SubMaster keeps each message's reader, not a copy: the reader must pin the received bytes, so that every message kept stays readable
  after its bytes are dropped and their memory reused, and a message of another type is still refused."""
  pm, sm = messaging.PubMaster(["carState"]), messaging.SubMaster(["carState"])
  kept = []
  for i in range(200):
    msg = messaging.new_message("carState")
    msg.carState.vEgo, msg.carState.steeringTorque = float(i), -float(i)
    pm.send("carState", msg.to_bytes())
    sm.update(0)
    assert sm.updated["carState"]
    kept.append(sm["carState"])
  gc.collect()
  junk = [bytes([i % 251]) * 512 for i in range(20000)]
  assert [(cs.vEgo, cs.steeringTorque) for cs in kept] == [(float(i), -float(i)) for i in range(200)] and len(junk) == 20000
  pm.send("carState", messaging.new_message("roadCameraState").to_bytes())
  sm.update(0)
  assert not sm.updated["carState"] and sm.dropped["carState"] == 1 and sm["carState"].vEgo == 199.0

def test_corrupt_messages_on_every_topic_modeld_reads_are_dropped_or_read_without_an_exception(openpilot_prefix):
  """Each byte of a message on each topic modeld subscribes to set to 0x00, 0x7f or 0xff, then one frame's inputs read from the bus as
  modeld reads them: the message is dropped (counted) or kept, and nothing raises. The copy SubMaster used to make aborted the process on
  some of these (a C++ exception pycapnp does not translate), on a deviceState modeld never reads as well."""
  from sunnypilot.modeld_v2.common.logs import Episodes
  from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs
  from sunnypilot.modeld_v2.daemon.device_params import TYPICAL_CAR
  from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
  from sunnypilot.modeld_v2.daemon.frame_inputs import FrameInputs
  from sunnypilot.modeld_v2.modeld import SUBSCRIBED
  services = [s for s in SUBSCRIBED if messaging.has_service(s)]
  pm, sm = messaging.PubMaster(services), messaging.SubMaster(services)
  inputs, lines = FrameInputs(BusInputs(Episodes(lambda line: None))), []
  inputs.use_cameras("ar0231", False)
  kept = dropped = 0
  for service in services:
    msg = messaging.new_message(service)
    if service == "liveCalibration": msg.liveCalibration.rpyCalib, msg.liveCalibration.height = [0.01, 0.02, 0.03], [1.3]
    if service == "carState": msg.carState.vEgo, msg.carState.leftBlinker = 20.0, True
    raw = msg.to_bytes()
    for at in range(len(raw)):
      for value in (0x00, 0x7F, 0xFF):
        pm.send(service, raw[:at] + bytes([value]) + raw[at + 1:])
        sm.update(0)
        kept, dropped = kept + sm.updated[service], dropped + sm.dropped[service]
        fed = inputs.step(sm, TYPICAL_CAR, DrivingState())
        lines.append((fed.lat_t, sm["roadCameraState"].frameId if sm.seen["roadCameraState"] else None))
  assert kept > 0 and dropped > 0 and len(lines) == kept + dropped, (kept, dropped, len(lines))
