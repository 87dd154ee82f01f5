// savina_caf: the peer of bench/actors/troupe_actors, written against CAF 0.17 (the C++ Actor
// Framework, Debian's libcaf-dev). The same programs with the same parameters and the same
// message protocol (counts per run are equal), measured by the same harness and printed as
// the same `name: value unit` lines, so bench/actors/run.sh can put them side by side.
//
//   savina_caf [--only NAME] [--reps N] [--workers N]
//
// CAF runs with its defaults except the scheduler's thread count (scheduler.max-threads),
// which is set to the worker count Troupe uses. Each repetition builds a fresh actor_system
// and times from the first spawn to await_all_actors_done(), as Troupe's side times from the
// first spawn to the return of tr_runtime_run. Parameters come from bench/actors/benches.h's
// values, repeated here because that header is Troupe's (this program must not include it).
#include <caf/all.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include "harness.h"

using namespace caf;

namespace {

constexpr int pingpong_n = 40000;
constexpr int counting_n = 1000000;
constexpr int threadring_actors = 100;
constexpr int threadring_hops = 100000;
constexpr int chameneos_creatures = 100;
constexpr int chameneos_meetings = 200000;
constexpr int big_actors = 120;
constexpr int big_pings = 20000;
constexpr int fjthrput_actors = 60;
constexpr int fjthrput_n = 10000;
constexpr int fib_n = 25;
constexpr uint64_t fib_expect = 75025;
constexpr uint64_t skynet_leaves = 1000000;
constexpr uint64_t skynet_fanout = 10;
constexpr uint64_t skynet_expect = 499999500000ull;
constexpr uint64_t fanin_total = 2000000;
constexpr uint64_t fanin_chunk = 1000;
constexpr int latency_samples = 2000;
constexpr int latency_warmup = 20;
constexpr uint64_t latency_gap_ns = 1000000;
constexpr int idle_actors = 4;
constexpr unsigned idle_ms = 2000;

using start_atom = atom_constant<atom("start")>;
using ping_atom = atom_constant<atom("ping")>;
using pong_atom = atom_constant<atom("pong")>;
using stop_atom = atom_constant<atom("stop")>;
using inc_atom = atom_constant<atom("inc")>;
using get_atom_t = atom_constant<atom("get")>;
using result_atom = atom_constant<atom("result")>;
using token_atom = atom_constant<atom("token")>;
using exit_atom = atom_constant<atom("exit")>;
using meet_atom = atom_constant<atom("meet")>;
using change_atom = atom_constant<atom("change")>;
using count_atom = atom_constant<atom("count")>;
using work_atom = atom_constant<atom("work")>;
using request_atom = atom_constant<atom("request")>;
using response_atom = atom_constant<atom("response")>;
using go_atom = atom_constant<atom("go")>;
using data_atom = atom_constant<atom("data")>;
using stamp_atom = atom_constant<atom("stamp")>;
using poke_atom = atom_constant<atom("poke")>;
using tick_atom = atom_constant<atom("tick")>;

// The scheduler thread count is the one knob we set; everything else is CAF's default.
struct bench_config : actor_system_config {
    explicit bench_config(const bench_args_t* a) {
        set("scheduler.max-threads", static_cast<config_value::integer>(a->workers));
    }
};

double ms_since(uint64_t t0) {
    return static_cast<double>(bench_now_ns() - t0) / 1e6;
}

actor sender_of(local_actor* self) {
    return actor_cast<actor>(self->current_sender());
}

// --- pingpong ---------------------------------------------------------------------------

class pp_pong : public event_based_actor {
public:
    using event_based_actor::event_based_actor;
    behavior make_behavior() override {
        return {
            [=](ping_atom) { send(sender_of(this), pong_atom::value); },
            [=](stop_atom) { quit(); },
        };
    }
};

class pp_ping : public event_based_actor {
public:
    pp_ping(actor_config& cfg, actor pong, uint64_t* pongs)
        : event_based_actor(cfg), pong_(std::move(pong)), pongs_out_(pongs) {}
    behavior make_behavior() override {
        return {
            [=](start_atom) { next(); },
            [=](pong_atom) {
                ++pongs_;
                next();
            },
        };
    }

private:
    void next() {
        if (left_ == 0) {
            send(pong_, stop_atom::value);
            *pongs_out_ = pongs_;
            quit();
            return;
        }
        --left_;
        send(pong_, ping_atom::value);
    }
    actor pong_;
    uint64_t* pongs_out_;
    uint64_t left_ = pingpong_n;
    uint64_t pongs_ = 0;
};

int bench_pingpong(const bench_args_t* a, double* ms) {
    bench_config cfg{a};
    actor_system sys{cfg};
    uint64_t pongs = 0;
    uint64_t t0 = bench_now_ns();
    auto pong = sys.spawn<pp_pong>();
    auto ping = sys.spawn<pp_ping>(pong, &pongs);
    anon_send(ping, start_atom::value);
    sys.await_all_actors_done();
    *ms = ms_since(t0);
    if (pongs != pingpong_n) {
        std::fprintf(stderr, "pingpong: %llu pongs, expected %d\n",
                     static_cast<unsigned long long>(pongs), pingpong_n);
        return -1;
    }
    return 0;
}

// --- counting ---------------------------------------------------------------------------

class count_counter : public event_based_actor {
public:
    using event_based_actor::event_based_actor;
    behavior make_behavior() override {
        return {
            [=](inc_atom) { ++count_; },
            [=](get_atom_t) {
                send(sender_of(this), result_atom::value, count_);
                quit();
            },
        };
    }

private:
    uint64_t count_ = 0;
};

class count_producer : public event_based_actor {
public:
    count_producer(actor_config& cfg, actor counter, uint64_t* result)
        : event_based_actor(cfg), counter_(std::move(counter)), result_(result) {}
    behavior make_behavior() override {
        return {
            [=](start_atom) {
                for (int i = 0; i < counting_n; i++)
                    send(counter_, inc_atom::value);
                send(counter_, get_atom_t::value);
            },
            [=](result_atom, uint64_t n) {
                *result_ = n;
                quit();
            },
        };
    }

private:
    actor counter_;
    uint64_t* result_;
};

int bench_counting(const bench_args_t* a, double* ms) {
    bench_config cfg{a};
    actor_system sys{cfg};
    uint64_t result = 0;
    uint64_t t0 = bench_now_ns();
    auto counter = sys.spawn<count_counter>();
    auto producer = sys.spawn<count_producer>(counter, &result);
    anon_send(producer, start_atom::value);
    sys.await_all_actors_done();
    *ms = ms_since(t0);
    if (result != counting_n) {
        std::fprintf(stderr, "counting: counted %llu, expected %d\n",
                     static_cast<unsigned long long>(result), counting_n);
        return -1;
    }
    return 0;
}

// --- threadring -------------------------------------------------------------------------

class ring_node : public event_based_actor {
public:
    ring_node(actor_config& cfg, const std::vector<actor>* ring, int index, uint64_t* tokens)
        : event_based_actor(cfg), ring_(ring), index_(index), tokens_(tokens) {}
    behavior make_behavior() override {
        return {
            [=](token_atom, uint64_t left) {
                ++*tokens_;
                if (left > 0)
                    send(next(), token_atom::value, left - 1);
                else
                    send(next(), exit_atom::value, uint64_t{threadring_actors});
            },
            [=](exit_atom, uint64_t left) {
                if (left > 1)
                    send(next(), exit_atom::value, left - 1);
                quit();
            },
        };
    }

private:
    const actor& next() const {
        return (*ring_)[(index_ + 1) % threadring_actors];
    }
    const std::vector<actor>* ring_; // complete before the first token is sent
    int index_;
    uint64_t* tokens_;
};

int bench_threadring(const bench_args_t* a, double* ms) {
    bench_config cfg{a};
    actor_system sys{cfg};
    std::vector<actor> ring;
    std::vector<uint64_t> tokens(threadring_actors, 0);
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < threadring_actors; i++)
        ring.push_back(sys.spawn<ring_node>(&ring, i, &tokens[i]));
    anon_send(ring[0], token_atom::value, uint64_t{threadring_hops});
    sys.await_all_actors_done();
    *ms = ms_since(t0);
    uint64_t sum = 0;
    for (auto t : tokens)
        sum += t;
    if (sum != threadring_hops + 1) {
        std::fprintf(stderr, "threadring: %llu token messages, expected %d\n",
                     static_cast<unsigned long long>(sum), threadring_hops + 1);
        return -1;
    }
    return 0;
}

// --- chameneos --------------------------------------------------------------------------

enum { red, yellow, blue, faded };

int complement(int c, int other) {
    if (c == faded || other == faded)
        return faded;
    return c == other ? c : 3 - c - other;
}

class mall : public event_based_actor {
public:
    mall(actor_config& cfg, uint64_t* sum) : event_based_actor(cfg), sum_out_(sum) {}
    behavior make_behavior() override {
        return {
            [=](meet_atom, int color, const actor& from) {
                if (left_ == 0) {
                    send(from, exit_atom::value);
                } else if (!waiting_) {
                    waiting_ = from;
                } else {
                    --left_;
                    send(waiting_, meet_atom::value, color, from);
                    waiting_ = nullptr;
                }
            },
            [=](count_atom, uint64_t meetings) {
                sum_ += meetings;
                if (++faded_ == chameneos_creatures) {
                    *sum_out_ = sum_;
                    quit();
                }
            },
        };
    }

private:
    uint64_t* sum_out_;
    uint64_t left_ = chameneos_meetings;
    actor waiting_;
    uint64_t sum_ = 0;
    int faded_ = 0;
};

class creature : public event_based_actor {
public:
    creature(actor_config& cfg, actor mall, int color)
        : event_based_actor(cfg), mall_(std::move(mall)), color_(color) {}
    behavior make_behavior() override {
        meet();
        return {
            [=](meet_atom, int other, const actor& from) {
                color_ = complement(color_, other);
                ++meetings_;
                send(from, change_atom::value, color_);
                meet();
            },
            [=](change_atom, int color) {
                color_ = color;
                ++meetings_;
                meet();
            },
            [=](exit_atom) {
                color_ = faded;
                send(mall_, count_atom::value, meetings_);
                quit();
            },
        };
    }

private:
    void meet() {
        send(mall_, meet_atom::value, color_, actor_cast<actor>(this));
    }
    actor mall_;
    int color_;
    uint64_t meetings_ = 0;
};

int bench_chameneos(const bench_args_t* a, double* ms) {
    bench_config cfg{a};
    actor_system sys{cfg};
    uint64_t sum = 0;
    uint64_t t0 = bench_now_ns();
    auto m = sys.spawn<mall>(&sum);
    for (int i = 0; i < chameneos_creatures; i++)
        sys.spawn<creature>(m, i % 3);
    sys.await_all_actors_done();
    *ms = ms_since(t0);
    if (sum != 2ull * chameneos_meetings) {
        std::fprintf(stderr, "chameneos: %llu meetings counted, expected %d\n",
                     static_cast<unsigned long long>(sum), 2 * chameneos_meetings);
        return -1;
    }
    return 0;
}

// --- big --------------------------------------------------------------------------------

struct big_result {
    uint64_t pongs = 0, errors = 0;
};

class big_actor : public event_based_actor {
public:
    big_actor(actor_config& cfg, int id, const std::vector<actor>* all, actor sink,
              big_result* out)
        : event_based_actor(cfg), id_(id), rng_(static_cast<uint64_t>(id) + 1), all_(all),
          sink_(std::move(sink)), out_(out) {}
    behavior make_behavior() override {
        return {
            [=](ping_atom, int from) { send((*all_)[from], pong_atom::value, id_); },
            [=](pong_atom, int from) {
                if (from >= 0)
                    ++out_->pongs;
                if (from != expected_)
                    ++out_->errors;
                if (pings_ == big_pings) {
                    send(sink_, exit_atom::value);
                    return;
                }
                expected_ = static_cast<int>(bench_rand(&rng_, big_actors));
                ++pings_;
                send((*all_)[expected_], ping_atom::value, id_);
            },
            [=](exit_atom) { quit(); },
        };
    }

private:
    int id_;
    int expected_ = -1;
    uint64_t pings_ = 0;
    uint64_t rng_;
    const std::vector<actor>* all_; // complete before the first pong is sent
    actor sink_;
    big_result* out_;
};

class big_sink : public event_based_actor {
public:
    big_sink(actor_config& cfg, const std::vector<actor>* all)
        : event_based_actor(cfg), all_(all) {}
    behavior make_behavior() override {
        return {
            [=](exit_atom) {
                if (++exits_ < big_actors)
                    return;
                for (auto& b : *all_)
                    send(b, exit_atom::value);
                quit();
            },
        };
    }

private:
    const std::vector<actor>* all_;
    int exits_ = 0;
};

int bench_big(const bench_args_t* a, double* ms) {
    bench_config cfg{a};
    actor_system sys{cfg};
    std::vector<actor> all;
    std::vector<big_result> res(big_actors);
    uint64_t t0 = bench_now_ns();
    auto sink = sys.spawn<big_sink>(&all);
    for (int i = 0; i < big_actors; i++)
        all.push_back(sys.spawn<big_actor>(i, &all, sink, &res[i]));
    for (auto& b : all)
        anon_send(b, pong_atom::value, -1);
    sys.await_all_actors_done();
    *ms = ms_since(t0);
    uint64_t pongs = 0, errors = 0;
    for (auto& r : res)
        pongs += r.pongs, errors += r.errors;
    if (pongs != uint64_t{big_actors} * big_pings || errors) {
        std::fprintf(stderr, "big: %llu pongs (expected %d), %llu from the wrong actor\n",
                     static_cast<unsigned long long>(pongs), big_actors * big_pings,
                     static_cast<unsigned long long>(errors));
        return -1;
    }
    return 0;
}

// --- fjthrput ---------------------------------------------------------------------------

volatile double fj_theta = 37.2;

struct fj_result {
    uint64_t handled = 0;
    double acc = 0;
};

class fj_actor : public event_based_actor {
public:
    fj_actor(actor_config& cfg, fj_result* out) : event_based_actor(cfg), out_(out) {}
    behavior make_behavior() override {
        return {
            [=](work_atom) {
                double sint = std::sin(fj_theta);
                out_->acc += sint * sint;
                if (++out_->handled == fjthrput_n)
                    quit();
            },
        };
    }

private:
    fj_result* out_;
};

int bench_fjthrput(const bench_args_t* a, double* ms) {
    bench_config cfg{a};
    actor_system sys{cfg};
    std::vector<fj_result> res(fjthrput_actors);
    std::vector<actor> all;
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < fjthrput_actors; i++)
        all.push_back(sys.spawn<fj_actor>(&res[i]));
    for (int n = 0; n < fjthrput_n; n++)
        for (auto& x : all)
            anon_send(x, work_atom::value);
    sys.await_all_actors_done();
    *ms = ms_since(t0);
    uint64_t handled = 0;
    for (auto& r : res)
        handled += r.handled;
    if (handled != uint64_t{fjthrput_actors} * fjthrput_n || !(res[0].acc > 0)) {
        std::fprintf(stderr, "fjthrput: %llu messages handled, expected %d\n",
                     static_cast<unsigned long long>(handled), fjthrput_actors * fjthrput_n);
        return -1;
    }
    return 0;
}

// --- fib --------------------------------------------------------------------------------

class fib_call : public event_based_actor {
public:
    fib_call(actor_config& cfg, uint64_t* result) : event_based_actor(cfg), result_(result) {}
    behavior make_behavior() override {
        return {
            [=](request_atom, uint64_t n) {
                parent_ = sender_of(this);
                if (n <= 2) {
                    responses_ = 1;
                    add(1);
                    return;
                }
                for (uint64_t k : {n - 1, n - 2})
                    send(spawn<fib_call>(static_cast<uint64_t*>(nullptr)), request_atom::value, k);
            },
            [=](response_atom, uint64_t v) { add(v); },
        };
    }

private:
    void add(uint64_t v) {
        sum_ += v;
        if (++responses_ < 2)
            return;
        if (result_)
            *result_ = sum_;
        else
            send(parent_, response_atom::value, sum_);
        quit();
    }
    uint64_t* result_; // the root only
    actor parent_;
    int responses_ = 0;
    uint64_t sum_ = 0;
};

int bench_fib(const bench_args_t* a, double* ms) {
    bench_config cfg{a};
    actor_system sys{cfg};
    uint64_t result = 0;
    uint64_t t0 = bench_now_ns();
    auto root = sys.spawn<fib_call>(&result);
    anon_send(root, request_atom::value, uint64_t{fib_n});
    sys.await_all_actors_done();
    *ms = ms_since(t0);
    if (result != fib_expect) {
        std::fprintf(stderr, "fib: fib(%d) = %llu, expected %llu\n", fib_n,
                     static_cast<unsigned long long>(result),
                     static_cast<unsigned long long>(fib_expect));
        return -1;
    }
    return 0;
}

// --- skynet -----------------------------------------------------------------------------

class sky_node : public event_based_actor {
public:
    sky_node(actor_config& cfg, uint64_t* result) : event_based_actor(cfg), result_(result) {}
    behavior make_behavior() override {
        return {
            [=](request_atom, uint64_t num, uint64_t size) {
                parent_ = sender_of(this);
                if (size == 1) {
                    send(parent_, response_atom::value, num);
                    quit();
                    return;
                }
                uint64_t step = size / skynet_fanout;
                for (uint64_t i = 0; i < skynet_fanout; i++)
                    send(spawn<sky_node>(static_cast<uint64_t*>(nullptr)), request_atom::value, num + i * step, step);
            },
            [=](response_atom, uint64_t v) {
                sum_ += v;
                if (++answers_ < skynet_fanout)
                    return;
                if (result_)
                    *result_ = sum_;
                else
                    send(parent_, response_atom::value, sum_);
                quit();
            },
        };
    }

private:
    uint64_t* result_; // the root only
    actor parent_;
    uint64_t answers_ = 0;
    uint64_t sum_ = 0;
};

int bench_skynet(const bench_args_t* a, double* ms) {
    bench_config cfg{a};
    actor_system sys{cfg};
    uint64_t result = 0;
    uint64_t t0 = bench_now_ns();
    auto root = sys.spawn<sky_node>(&result);
    anon_send(root, request_atom::value, uint64_t{0}, skynet_leaves);
    sys.await_all_actors_done();
    *ms = ms_since(t0);
    if (result != skynet_expect) {
        std::fprintf(stderr, "skynet: sum %llu, expected %llu\n",
                     static_cast<unsigned long long>(result),
                     static_cast<unsigned long long>(skynet_expect));
        return -1;
    }
    return 0;
}

// --- fan-in -----------------------------------------------------------------------------

struct fanin_result {
    uint64_t received = 0, sum = 0;
};

class fanin_consumer : public event_based_actor {
public:
    fanin_consumer(actor_config& cfg, fanin_result* out) : event_based_actor(cfg), out_(out) {}
    behavior make_behavior() override {
        return {
            [=](data_atom, uint64_t v) {
                out_->sum += v;
                if (++out_->received == fanin_total)
                    quit();
            },
        };
    }

private:
    fanin_result* out_;
};

class fanin_producer : public event_based_actor {
public:
    fanin_producer(actor_config& cfg, actor consumer, uint64_t n)
        : event_based_actor(cfg), consumer_(std::move(consumer)), left_(n) {}
    behavior make_behavior() override {
        return {
            [=](go_atom) {
                uint64_t n = left_ < fanin_chunk ? left_ : fanin_chunk;
                for (uint64_t i = 0; i < n; i++)
                    send(consumer_, data_atom::value, left_ - i);
                left_ -= n;
                if (left_ == 0)
                    quit();
                else
                    send(actor_cast<actor>(this), go_atom::value);
            },
        };
    }

private:
    actor consumer_;
    uint64_t left_;
};

int fanin_once(const bench_args_t* a, unsigned p, double* ms) {
    bench_config cfg{a};
    actor_system sys{cfg};
    fanin_result res;
    uint64_t per = fanin_total / p;
    uint64_t t0 = bench_now_ns();
    auto c = sys.spawn<fanin_consumer>(&res);
    std::vector<actor> producers;
    for (unsigned i = 0; i < p; i++)
        producers.push_back(sys.spawn<fanin_producer>(c, per));
    for (auto& x : producers)
        anon_send(x, go_atom::value);
    sys.await_all_actors_done();
    *ms = ms_since(t0);
    uint64_t want = p * (per * (per + 1) / 2);
    if (res.received != fanin_total || res.sum != want) {
        std::fprintf(stderr, "fanin_%u: received %llu, expected %llu\n", p,
                     static_cast<unsigned long long>(res.received),
                     static_cast<unsigned long long>(fanin_total));
        return -1;
    }
    return 0;
}

int bench_fanin(const bench_args_t* a) {
    for (unsigned p : {1u, 2u, 4u, 8u}) {
        char name[32];
        std::snprintf(name, sizeof(name), "fanin_%u", p);
        if (!bench_selected(a, name))
            continue;
        double ms[BENCH_MAX_REPS];
        for (int r = 0; r < a->reps; r++)
            if (fanin_once(a, p, &ms[r]) < 0)
                return -1;
        double med = bench_median(ms, a->reps);
        bench_print(name, fanin_total / (med / 1e3) / 1e6, "Mmsg/s");
    }
    return 0;
}

// --- latency and idle CPU ---------------------------------------------------------------

class lat_actor : public event_based_actor {
public:
    lat_actor(actor_config& cfg, uint64_t* samples, int* n)
        : event_based_actor(cfg), samples_(samples), n_(n) {}
    behavior make_behavior() override {
        return {
            [=](stamp_atom, uint64_t sent) {
                uint64_t now = bench_now_ns();
                if (*n_ >= latency_warmup)
                    samples_[*n_ - latency_warmup] = now - sent;
                if (++*n_ == latency_warmup + latency_samples)
                    quit();
            },
        };
    }

private:
    uint64_t* samples_;
    int* n_;
};

// 0 when lat_actor recorded every sample; -1, saying so, when it is short.
int check_latency(const char* name, int n) {
    if (n != latency_warmup + latency_samples) {
        std::fprintf(stderr, "%s: %d messages handled\n", name, n);
        return -1;
    }
    return 0;
}

// latency: an actor woken every ~1 ms by delayed_send (CAF's clock) stamps a message for
// lat_actor; the same program as Troupe's timer-driven one and the Go and Erlang peers'.
// p50, p90, p99 and max: each the median over --reps runs (harness.h), a fresh system each.
int latency_once(const bench_args_t* a, uint64_t* samples) {
    bench_config cfg{a};
    actor_system sys{cfg};
    int n = 0;
    auto x = sys.spawn<lat_actor>(samples, &n);
    auto gap = std::chrono::nanoseconds(latency_gap_ns);
    sys.spawn([x, gap](event_based_actor* self) -> behavior {
        auto sent = std::make_shared<int>(0);
        self->delayed_send(self, gap, tick_atom::value);
        return {
            [=](tick_atom) { // send, then arm the next tick: the peers' order
                self->send(x, stamp_atom::value, bench_now_ns());
                if (++*sent == latency_warmup + latency_samples)
                    self->quit();
                else
                    self->delayed_send(self, gap, tick_atom::value);
            },
        };
    });
    sys.await_all_actors_done();
    return check_latency("latency", n);
}

// wakeup: the main thread, outside the actor system, sends every ~1 ms (Troupe's wakeup).
int wakeup_once(const bench_args_t* a, uint64_t* samples) {
    bench_config cfg{a};
    actor_system sys{cfg};
    int n = 0;
    auto x = sys.spawn<lat_actor>(samples, &n);
    for (int i = 0; i < latency_warmup + latency_samples; i++) {
        bench_sleep_ns(latency_gap_ns);
        anon_send(x, stamp_atom::value, bench_now_ns());
    }
    sys.await_all_actors_done();
    return check_latency("wakeup", n);
}

int bench_latency(const bench_args_t* a) {
    return bench_latency_reps(a, "latency", latency_samples, latency_once);
}

int bench_wakeup(const bench_args_t* a) {
    return bench_latency_reps(a, "wakeup", latency_samples, wakeup_once);
}

int bench_idle_cpu(const bench_args_t* a) {
    bench_config cfg{a};
    actor_system sys{cfg};
    std::vector<uint64_t> pokes(idle_actors, 0);
    std::vector<actor> all;
    for (int i = 0; i < idle_actors; i++) {
        uint64_t* p = &pokes[i];
        all.push_back(sys.spawn([p]() -> behavior { return {[p](poke_atom) { ++*p; }}; }));
        anon_send(all.back(), poke_atom::value);
    }
    double pct = bench_idle_pct(100, idle_ms); // 100 ms for the pokes, then the window
    for (auto& x : all)
        anon_send_exit(x, exit_reason::user_shutdown);
    sys.await_all_actors_done();
    if (pct < 0) return -1;
    bench_print_idle(pct);
    return 0;
}

struct timed_bench {
    const char* name;
    bench_fn fn;
};

const timed_bench timed[] = {
    {"pingpong", bench_pingpong}, {"counting", bench_counting}, {"threadring", bench_threadring},
    {"chameneos", bench_chameneos}, {"big", bench_big},       {"fjthrput", bench_fjthrput},
    {"fib", bench_fib},           {"skynet", bench_skynet},
};

} // namespace

int main(int argc, char** argv) {
    bench_args_t a;
    if (bench_parse(argc, argv, &a) < 0)
        return 2;
    std::printf("# caf %d.%d.%d: %u scheduler threads, median of %d reps\n", CAF_VERSION / 10000,
                CAF_VERSION / 100 % 100, CAF_VERSION % 100, a.workers, a.reps);
    int failed = 0;
    for (const auto& t : timed)
        if (bench_selected(&a, t.name) && bench_timed(&a, t.name, t.fn) < 0)
            failed = 1;
    if (bench_fanin(&a) < 0)
        failed = 1;
    if (bench_selected(&a, "latency") && bench_latency(&a) < 0)
        failed = 1;
    if (bench_selected(&a, "wakeup") && bench_wakeup(&a) < 0) failed = 1;
    if (bench_selected(&a, "idle_cpu") && bench_idle_cpu(&a) < 0)
        failed = 1;
    return failed;
}
