"""Helpers shared by the test modules (import them as ``tests.support.<module>``):
scripted models (`scripts`), fake-server engines (`http`), batch servers (`batch`),
guest-process helpers (`guests`) and the journal crash scenarios (`journal_scenarios`)."""
