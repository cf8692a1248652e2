"""The event bus: Kafka (aiokafka) in production, an in-process bus for one process (see base.py)."""

from trainmedic.agent.bus.base import Bus, Consumer, OffsetTracker, Record, TopicPartition, partition_for
from trainmedic.agent.bus.memory import MemoryBus

__all__ = ["Bus", "Consumer", "MemoryBus", "OffsetTracker", "Record", "TopicPartition", "partition_for"]
