"""CycleSL (docs/algorithms.md, CycleSL) against an independent reference written from A.2 (CyclePSL):
participants from the run's generator, pooled features (CSL-2), E reshuffled passes in b_S-chunks
with |D_i|-weighted losses (CSL-3, CSL-4), cut gradients at the updated frozen server (CSL-5), the
client backward through the round's single forward (CSL-6); CycleSFL's broadcast (CSL-7). Plus the
cheap invariants of A.4.7 and the flags' bad-input handling."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from tests.cli_checks import assert_train_flag_error
from tests.engine_builders import flat, make_data, small_model
from trainers.engine.split_engine import STRATEGY_STREAM, DeviceData, SplitEngine
from trainers.inputs.partition import DeviceSampler
from trainers.roles.messages import CutGradient
from trainers.roles.optim import OptimizerSpec
from trainers.strategies import PSL, CycleSL

CUT, B, N, M = 9, 16, 4, 10




def build(opt: str, lr: float, params) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr) if opt == "adam" else torch.optim.SGD(params, lr=lr)


def reference_cyclesl(data: DeviceData, rounds: int, rho: float, epochs: int, opt: str, lr: float, base: str = "psl"):
    """A.2 (CyclePSL; CycleSFL adds CSL-7) in plain torch; yields after every round."""
    model = small_model()
    clients = [copy.deepcopy(nn.Sequential(*model[:CUT])) for _ in range(N)]
    server = copy.deepcopy(nn.Sequential(*model[CUT:]))
    c_opt = [build(opt, lr, c.parameters()) for c in clients]
    s_opt = build(opt, lr, server.parameters())
    samplers = [DeviceSampler(data.parts[i], B, [0, i]) for i in range(N)]
    sizes = [len(p) for p in data.parts]
    rng = np.random.default_rng([0, STRATEGY_STREAM])
    for t in range(1, rounds + 1):
        S_t = list(range(N)) if rho >= 1 else sorted(int(d) for d in rng.choice(N, size=int(np.ceil(rho * N)),
                                                                                  replace=False))   # step 1
        F, Y = {}, {}
        for i in S_t:                                                                         # step 2
            idx = torch.from_numpy(samplers[i].next())
            F[i], Y[i] = clients[i](data.x_train[idx]), data.y_train[idx]
        feats = torch.cat([F[i].detach() for i in S_t])                                       # CSL-2
        labels = torch.cat([Y[i] for i in S_t])
        w = torch.cat([torch.full((len(Y[i]),), float(sizes[i])) for i in S_t])
        n, steps = len(labels), 0
        for _ in range(epochs):                                                               # CSL-4
            order = rng.permutation(n)
            for start in range(0, n, B):
                beta = torch.from_numpy(order[start:start + B])
                ce = nn.functional.cross_entropy(server(feats[beta]), labels[beta], reduction="none")
                s_opt.zero_grad()
                ((w[beta] * ce).sum() / w[beta].sum()).backward()                              # CSL-3
                s_opt.step()
                steps += 1
        G = {}
        for i in S_t:                                                                         # CSL-5, θ_S^{t+1}
            x = F[i].detach().requires_grad_(True)
            G[i] = torch.autograd.grad(nn.functional.cross_entropy(server(x), Y[i]), x)[0]
        if base == "sglr":                                                                    # CSL-8
            A_t = [S_t[k] for k in rng.permutation(len(S_t))[:len(S_t) // 2]]
            g_bar = sum(sizes[i] * G[i].sum(0) for i in A_t) / sum(sizes[i] * len(Y[i]) for i in A_t)
            for i in A_t:
                G[i] = g_bar.expand_as(G[i])
        s_opt.zero_grad()
        for i in S_t:                                                                         # CSL-6, no re-forward
            c_opt[i].zero_grad()
            F[i].backward(G[i])
            c_opt[i].step()
        if base == "sfl":                                                                     # CSL-7
            ws = [float(sizes[i]) for i in S_t]
            avg = [sum(wi * p.detach() for wi, p in zip(ws, ps)) / sum(ws) for ps in zip(*[clients[i].parameters() for i in S_t])]
            for c in clients:
                with torch.no_grad():
                    for p, a in zip(c.parameters(), avg):
                        p.copy_(a)
        yield t, S_t, steps, clients, server


def make_cycle_engine(data: DeviceData, opt: str = "sgd", lr: float = 0.1, strategy=None, **options) -> SplitEngine:
    return SplitEngine(small_model(), [CUT] * N, strategy or CycleSL(**options), data, OptimizerSpec(opt, lr),
                       batch_size=B, seed=0)


def server_of(engine: SplitEngine) -> nn.Sequential:
    return nn.Sequential(*[engine.edge.instances[(None, j)] for j in range(CUT, 11)])


@pytest.mark.parametrize("opt,lr,base", [("sgd", 0.1, "psl"), ("adam", 0.01, "psl"), ("sgd", 0.1, "sfl"),
                                         ("sgd", 0.1, "sglr")])
def test_cyclesl_matches_reference_from_the_spec(opt: str, lr: float, base: str) -> None:
    data, rho, epochs = make_data(N, "dirichlet"), 0.75, 2
    engine = make_cycle_engine(data, opt, lr, participation=rho, server_epochs=epochs, cycle_base=base)
    for t, S_t, steps, clients, server in reference_cyclesl(data, 3, rho, epochs, opt, lr, base):
        stats = engine.run_round(t)
        assert stats.participants == S_t
        assert stats.metrics["server_steps"] == steps == epochs * 3
        assert torch.allclose(flat(server_of(engine)), flat(server), atol=1e-5, rtol=0), f"server, round {t}"
        for i in range(N):
            assert torch.allclose(flat(engine.devices[i].blocks), flat(clients[i]), atol=1e-5, rtol=0), \
                f"device {i}, round {t}"


def test_each_feature_used_exactly_e_times_per_round() -> None:
    data, epochs = make_data(N, "dirichlet"), 3
    engine = make_cycle_engine(data, participation=1.0, server_epochs=epochs)
    chunks = []
    original = engine.strategy.server_batches
    engine.strategy.server_batches = lambda ctx, n: chunks.append((n, original(ctx, n))) or chunks[-1][1]
    engine.run_round(1)
    (n, batches), = chunks
    assert n == N * B
    assert len(batches) == epochs * -(-n // B)                            # E·⌈n_S/b_S⌉ steps
    counts = np.bincount(torch.cat(batches).numpy(), minlength=n)
    assert (counts == epochs).all()
    # reshuffled: some chunk mixes devices (features of device i are rows i·B..(i+1)·B−1)
    assert any(len(set((b // B).tolist())) > 1 for b in batches)


def test_clients_answered_by_the_updated_server_without_reforward() -> None:
    data = make_data(N, "dirichlet")
    engine = make_cycle_engine(data, participation=1.0, server_epochs=1)
    forwards = [0] * N
    for i, d in enumerate(engine.devices):
        d.blocks[0].register_forward_hook(lambda m, inp, out, i=i: forwards.__setitem__(i, forwards[i] + 1))
    captured = {}
    serve = engine.strategy.serve

    def spy(edge, ctx, arrivals):
        captured["pre"] = copy.deepcopy(server_of(engine))
        captured["clients"] = [flat(d.blocks) for d in engine.devices]
        captured["arrivals"] = list(arrivals)
        captured["replies"] = serve(edge, ctx, arrivals)
        captured["post"] = copy.deepcopy(server_of(engine))
        return captured["replies"]

    engine.strategy.serve = spy
    stats = engine.run_round(1)
    assert forwards == [1] * N                                            # one client forward per round
    # the round reports the participants' mean of their own mean CE at the updated frozen server (CSL-5's L_i)
    with torch.no_grad():
        at_post = [nn.functional.cross_entropy(captured["post"](a.tensor), a.labels) for a in captured["arrivals"]]
    assert stats.loss == pytest.approx(float(sum(at_post)) / N, rel=1e-6)
    # the gradient pass does not move the server: the live server is the post-phase snapshot
    assert torch.equal(flat(server_of(engine)), flat(captured["post"]))
    assert not torch.equal(flat(captured["pre"]), flat(captured["post"]))
    for a, reply in zip(captured["arrivals"], captured["replies"]):
        def grad_at(server):
            x = a.tensor.detach().requires_grad_(True)
            return torch.autograd.grad(nn.functional.cross_entropy(server(x), a.labels), x)[0]
        assert torch.allclose(reply.tensor, grad_at(captured["post"]), atol=1e-6, rtol=0)
        assert not torch.allclose(reply.tensor, grad_at(captured["pre"]), atol=1e-6, rtol=0)
    # the client's update is J_iᵀG_i of the round's forward (at the unchanged client weights)
    for i, (a, reply) in enumerate(zip(captured["arrivals"], captured["replies"])):
        model = small_model()
        client = copy.deepcopy(nn.Sequential(*model[:CUT]))
        torch.nn.utils.vector_to_parameters(captured["clients"][i], client.parameters())
        idx = torch.from_numpy(DeviceSampler(data.parts[i], B, [0, i]).next())
        out = client(data.x_train[idx])
        assert torch.allclose(out, a.tensor, atol=1e-6, rtol=0)
        out.backward(reply.tensor)
        with torch.no_grad():
            for p in client.parameters():
                p -= 0.1 * p.grad
        assert torch.allclose(flat(engine.devices[i].blocks), flat(client), atol=1e-6, rtol=0)


class ServerFrozen:
    """A strategy whose server learning rate is 0 (the client side keeps the run's)."""

    def optimizer(self, role, spec):
        return replace(spec, lr=0.0) if role == "server" else spec


class FrozenCycleSL(ServerFrozen, CycleSL):
    pass


class FrozenPSL(ServerFrozen, PSL):
    pass


def test_server_lr_zero_gives_psl_cut_gradients() -> None:
    data = make_data(N, "dirichlet")
    cycle = make_cycle_engine(data, strategy=FrozenCycleSL(participation=1.0, server_epochs=2))
    psl = make_cycle_engine(data, strategy=FrozenPSL())
    replies: dict[str, list] = {"cycle": [], "psl": []}
    for name, engine in (("cycle", cycle), ("psl", psl)):     # what each device receives
        send = engine.net.send
        engine.net.send = lambda to, msg, send=send, name=name: (
            replies[name].append(msg) if isinstance(msg, CutGradient) else None) or send(to, msg)
    for t in (1, 2, 3):
        cycle.run_round(t)
        psl.run_round(t)
    assert len(replies["cycle"]) == 3 * N
    for a, b in zip(replies["cycle"], replies["psl"], strict=True):
        assert a.device == b.device
        assert torch.allclose(a.tensor, b.tensor, atol=1e-6, rtol=0)
    for i in range(N):
        assert torch.allclose(flat(cycle.devices[i].blocks), flat(psl.devices[i].blocks), atol=1e-6, rtol=0)
    # with a server learning rate the answers differ
    moving, frozen = make_cycle_engine(data, server_epochs=2), make_cycle_engine(data, strategy=FrozenPSL())
    moving.run_round(1)
    frozen.run_round(1)
    assert not torch.allclose(flat(moving.devices[0].blocks), flat(frozen.devices[0].blocks), atol=1e-6, rtol=0)


def test_non_participants_untouched_in_cyclepsl() -> None:
    data = make_data(N, "dirichlet")
    engine = make_cycle_engine(data, participation=0.5)
    before = [flat(d.blocks) for d in engine.devices]
    stats = engine.run_round(1)
    assert len(stats.participants) == 2
    for i in range(N):
        assert torch.equal(before[i], flat(engine.devices[i].blocks)) == (i not in stats.participants)


# ---- flags ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,flag", [
    (["--algorithm", "cyclesl", "--server-epochs", "0"], "--server-epochs"),
    (["--algorithm", "cyclesl", "--cycle-base", "sgl"], "--cycle-base"),
    (["--algorithm", "cyclesl", "--participation", "1.5"], "--participation"),
    (["--algorithm", "sfl-v1", "--server-epochs", "2"], "--server-epochs"),
])
def test_bad_cyclesl_flags_exit_2(argv, flag, capsys) -> None:
    assert_train_flag_error(argv, flag, capsys)


def test_cyclesglr_active_half_receives_one_common_row(monkeypatch) -> None:
    """CSL-8 topology: ⌊n_t/2⌋ participants get identical rows (all equal to each other), the rest their own
    gradients; client models are never averaged and the accuracy is the mean over devices' models."""
    data = make_data(N, "dirichlet")
    engine = make_cycle_engine(data, participation=1.0, cycle_base="sglr")
    received = {}
    import trainers.engine.sync_round as sync_round
    backward = sync_round.backward_all

    def spy(eng, replies):
        received.update({d: r.tensor.clone() for d, r in replies.items()})
        backward(eng, replies)
    monkeypatch.setattr(sync_round, "backward_all", spy)
    stats = engine.run_round(1)
    assert not stats.aggregated
    shared = [d for d, g in received.items() if torch.equal(g, g[:1].expand_as(g))]
    assert len(shared) == N // 2
    rows = {tuple(received[d][0].flatten().tolist()) for d in shared}
    assert len(rows) == 1
    assert len(engine.strategy.eval_models(engine)) == N
