"""The actor/learner split (DESIGN.md §7, RELIABILITY.md E1-E5): off-policy learning fed by actors in other processes
or on other machines (sim hosts, a robot's computer) over gRPC.

    wire      messages as safetensors bytes with a JSON header; chunked blobs (no pickle)
    auth      the shared token every call carries
    service   the learner's four RPCs and the actors' client
    hub       the learner's protocol state (sequence numbers, allowances, the published policy)
    learner   the learner's runner: replay per actor slot, updates, publishing, checkpoints
    spool     an actor's bounded on-disk queue of unsent messages
    link      an actor's network thread
    actor     an actor's control loop, with its safe hold
"""
