"""Traffic simulator: realistic agent runs sent through the client, checked against docs/policy.md.

``fairmeter simulate`` (and ``fairmeter up``'s demo) plans runs of every kind — clean
completions, duplicate tool calls, client and server drops, resumes with replayed context
and redone work, provider/tool/client/unknown failures, user and system cancels, abandoned
runs — with a seeded generator (:mod:`.scenarios`, :mod:`.plan`), computes the decision each
must get with the project's pure policy (:mod:`.expected`), sends them through
``fairmeter_client.Meter`` (:mod:`.send`), waits until the server has settled them (:mod:`.wait`)
and compares (:mod:`.report`); :mod:`.simulation` puts these together. Nothing is imported
here, so the ``fairmeter`` command line stays quick to start.
"""
