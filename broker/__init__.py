"""Everything Kafka: the one client configuration, admin/producer/reader, the local KRaft launcher, jar fetching."""
