%% savina_erl: the Erlang peer of bench/actors/troupe_actors. The same programs as Troupe's
%% and CAF's (bench/peers/caf) with the same parameters, the same message protocol (messages
%% per run are equal, apart from a handful of set-up messages that hand out pids) and the same
%% result checks, printed as the same `name: value unit` lines, so bench/actors/run.sh can put
%% them side by side. Exits 1 when a result is wrong.
%%
%%   savina_erlang [--only NAME] [--reps N] [--workers N]
%%
%% `make bench-actors` compiles this file with erlc into build/bench/peers/erlang/ and writes
%% the launcher savina_erlang there (CMakeLists.txt here), which runs
%%   erl -noshell +P 4194304 -pa DIR -s savina_erl main -extra ARGS
%%
%% An actor is a process; the long-lived ones that take the bulk of the messages set
%% process_flag(message_queue_data, off_heap). Results come back to the benchmark's process
%% as messages; it monitors the fixed-size benchmarks' processes and times from the first
%% spawn until every one is down, the span Troupe and CAF time. fib and skynet (150 k and
%% 1.1 M processes) are timed until the root's answer, which every other process has sent
%% its part of as its last act: monitoring a million processes is not how Erlang waits.
%%
%% Settings: Erlang/OTP's defaults (schedulers = online cores, default busy-wait) except
%% schedulers_online, set to --workers when fewer, and +P (the process limit, 262144 by
%% default), raised so that skynet's 1.1 M processes can exist at once.
-module(savina_erl).
-export([main/0]).

-define(PINGPONG_N, 40000).
-define(COUNTING_N, 1000000).
-define(THREADRING_ACTORS, 100).
-define(THREADRING_HOPS, 100000).
-define(CHAMENEOS_CREATURES, 100).
-define(CHAMENEOS_MEETINGS, 200000).
-define(BIG_ACTORS, 120).
-define(BIG_PINGS, 20000).
-define(FJTHRPUT_ACTORS, 60).
-define(FJTHRPUT_N, 10000).
-define(FIB_N, 25).
-define(FIB_EXPECT, 75025).
-define(SKYNET_LEAVES, 1000000).
-define(SKYNET_FANOUT, 10).
-define(SKYNET_EXPECT, 499999500000).
-define(FANIN_TOTAL, 2000000).
-define(FANIN_CHUNK, 1000).
-define(LATENCY_SAMPLES, 2000).
-define(LATENCY_WARMUP, 20).
-define(IDLE_ACTORS, 4).
-define(IDLE_MS, 2000).
-define(MAX_REPS, 101).

%% --- helpers ------------------------------------------------------------------------------

now_ns() -> erlang:monotonic_time(nanosecond).

ms_since(T0) -> (now_ns() - T0) / 1.0e6.

%% A monitored process with an off-heap message queue: a hot mailbox.
hot(F) ->
    {Pid, _Ref} = spawn_opt(fun() ->
                                    process_flag(message_queue_data, off_heap),
                                    F()
                            end, [monitor]),
    Pid.

%% Waits until N monitored processes are down; ok, or {crashed, Reason}.
await_down(0) -> ok;
await_down(N) ->
    receive
        {'DOWN', _, process, _, normal} -> await_down(N - 1);
        {'DOWN', _, process, _, Reason} -> {crashed, Reason}
    end.

%% {Ms, ok} when Ok, else {Ms, {error, Why}}.
check(Ms, true, _Fmt, _Args) -> {Ms, ok};
check(Ms, false, Fmt, Args) -> {Ms, {error, io_lib:format(Fmt, Args)}}.

%% --- pingpong -----------------------------------------------------------------------------

pong() ->
    receive
        {ping, From} -> From ! pong, pong();
        stop -> ok
    end.

ping(Pong, Left, Pongs, Main) ->
    receive
        start -> ping_next(Pong, Left, Pongs, Main);
        pong -> ping_next(Pong, Left, Pongs + 1, Main)
    end.

ping_next(Pong, 0, Pongs, Main) ->
    Pong ! stop,
    Main ! {pongs, Pongs};
ping_next(Pong, Left, Pongs, Main) ->
    Pong ! {ping, self()},
    ping(Pong, Left - 1, Pongs, Main).

pingpong() ->
    Main = self(),
    T0 = now_ns(),
    Pong = hot(fun pong/0),
    Ping = hot(fun() -> ping(Pong, ?PINGPONG_N, 0, Main) end),
    Ping ! start,
    Down = await_down(2),
    Ms = ms_since(T0),
    Pongs = receive {pongs, P} -> P end,
    check(Ms, Down =:= ok andalso Pongs =:= ?PINGPONG_N, "~p pongs, expected ~p",
          [Pongs, ?PINGPONG_N]).

%% --- counting -----------------------------------------------------------------------------

counter(Count) ->
    receive
        inc -> counter(Count + 1);
        {get, From} -> From ! {result, Count}
    end.

producer(Counter, Main) ->
    receive start -> ok end,
    produce(Counter, ?COUNTING_N),
    Counter ! {get, self()},
    receive {result, N} -> Main ! {counted, N} end.

produce(_, 0) -> ok;
produce(Counter, N) -> Counter ! inc, produce(Counter, N - 1).

counting() ->
    Main = self(),
    T0 = now_ns(),
    Counter = hot(fun() -> counter(0) end),
    Producer = hot(fun() -> producer(Counter, Main) end),
    Producer ! start,
    Down = await_down(2),
    Ms = ms_since(T0),
    N = receive {counted, C} -> C end,
    check(Ms, Down =:= ok andalso N =:= ?COUNTING_N, "counted ~p, expected ~p",
          [N, ?COUNTING_N]).

%% --- threadring ---------------------------------------------------------------------------

%% A token carries the hops left; the holder of the last one sends exit, which carries how
%% many nodes it has still to stop, around the ring. Each node reports its token count.
ring_node(Next, Tokens, Main) ->
    receive
        {token, 0} ->
            Next ! {exit, ?THREADRING_ACTORS},
            ring_node(Next, Tokens + 1, Main);
        {token, Left} ->
            Next ! {token, Left - 1},
            ring_node(Next, Tokens + 1, Main);
        {exit, Left} ->
            Left > 1 andalso (Next ! {exit, Left - 1}),
            Main ! {tokens, Tokens}
    end.

%% The last node is spawned first and learns its successor, the first node, by a message.
ring_spawn(0, Next, Main) -> hot(fun() -> ring_node(Next, 0, Main) end);
ring_spawn(I, Next, Main) -> ring_spawn(I - 1, hot(fun() -> ring_node(Next, 0, Main) end), Main).

threadring() ->
    Main = self(),
    T0 = now_ns(),
    Last = hot(fun() -> receive {next, Next} -> ring_node(Next, 0, Main) end end),
    First = ring_spawn(?THREADRING_ACTORS - 2, Last, Main),
    Last ! {next, First},
    First ! {token, ?THREADRING_HOPS},
    Down = await_down(?THREADRING_ACTORS),
    Ms = ms_since(T0),
    Sum = lists:sum([receive {tokens, T} -> T end || _ <- lists:seq(1, ?THREADRING_ACTORS)]),
    check(Ms, Down =:= ok andalso Sum =:= ?THREADRING_HOPS + 1,
          "~p token messages, expected ~p", [Sum, ?THREADRING_HOPS + 1]).

%% --- chameneos ----------------------------------------------------------------------------

-define(FADED, 3).

complement(C, O) when C =:= ?FADED; O =:= ?FADED -> ?FADED;
complement(C, C) -> C;
complement(C, O) -> 3 - C - O.

mall(Left, Waiting, Sum, Faded, Main) ->
    receive
        {count, M} when Faded + 1 =:= ?CHAMENEOS_CREATURES ->
            Main ! {meetings, Sum + M};
        {count, M} ->
            mall(Left, Waiting, Sum + M, Faded + 1, Main);
        {meet, _, From} when Left =:= 0 ->
            From ! exit,
            mall(Left, Waiting, Sum, Faded, Main);
        {meet, _, From} when Waiting =:= none ->
            mall(Left, From, Sum, Faded, Main);
        {meet, Color, From} ->
            Waiting ! {meet, Color, From},
            mall(Left - 1, none, Sum, Faded, Main)
    end.

creature(Mall, Color, Meetings) ->
    Mall ! {meet, Color, self()},
    receive
        {meet, Other, From} ->
            C = complement(Color, Other),
            From ! {change, C},
            creature(Mall, C, Meetings + 1);
        {change, C} ->
            creature(Mall, C, Meetings + 1);
        exit ->
            Mall ! {count, Meetings}
    end.

chameneos() ->
    Main = self(),
    T0 = now_ns(),
    Mall = hot(fun() -> mall(?CHAMENEOS_MEETINGS, none, 0, 0, Main) end),
    [hot(fun() -> creature(Mall, I rem 3, 0) end) || I <- lists:seq(0, ?CHAMENEOS_CREATURES - 1)],
    Down = await_down(?CHAMENEOS_CREATURES + 1),
    Ms = ms_since(T0),
    Sum = receive {meetings, S} -> S end,
    check(Ms, Down =:= ok andalso Sum =:= 2 * ?CHAMENEOS_MEETINGS,
          "~p meetings counted, expected ~p", [Sum, 2 * ?CHAMENEOS_MEETINGS]).

%% --- big ----------------------------------------------------------------------------------

%% harness.h's bench_rand: the same LCG, so every side makes the same choices.
bench_rand(State, Bound) ->
    S = (State * 6364136223846793005 + 1442695040888963407) band 16#FFFFFFFFFFFFFFFF,
    {(S bsr 33) rem Bound, S}.

-record(big, {id, all, sink, main, expected = -1, rng, pings = 0, pongs = 0, errors = 0}).

%% {start, All} is the first pong (from -1); it hands out the tuple of every actor's pid.
big_actor(Id, Sink, Main) ->
    receive
        {start, All} ->
            big_pong(-1, #big{id = Id, all = All, sink = Sink, main = Main, rng = Id + 1})
    end.

big_loop(B) ->
    receive
        {ping, From} ->
            element(From + 1, B#big.all) ! {pong, B#big.id},
            big_loop(B);
        {pong, From} ->
            big_pong(From, B);
        exit ->
            B#big.main ! {big, B#big.pongs, B#big.errors}
    end.

big_pong(From, B0) ->
    B = B0#big{pongs = B0#big.pongs + (if From >= 0 -> 1; true -> 0 end),
               errors = B0#big.errors + (if From =/= B0#big.expected -> 1; true -> 0 end)},
    case B#big.pings of
        ?BIG_PINGS ->
            B#big.sink ! exit,
            big_loop(B);
        Pings ->
            {To, Rng} = bench_rand(B#big.rng, ?BIG_ACTORS),
            element(To + 1, B#big.all) ! {ping, B#big.id},
            big_loop(B#big{expected = To, rng = Rng, pings = Pings + 1})
    end.

big_sink(All, ?BIG_ACTORS) -> [P ! exit || P <- tuple_to_list(All)];
big_sink(All, Exits) -> receive exit -> big_sink(All, Exits + 1) end.

big() ->
    Main = self(),
    T0 = now_ns(),
    Sink = hot(fun() -> receive {all, All} -> big_sink(All, 0) end end),
    All = list_to_tuple([hot(fun() -> big_actor(I, Sink, Main) end)
                         || I <- lists:seq(0, ?BIG_ACTORS - 1)]),
    Sink ! {all, All},
    [P ! {start, All} || P <- tuple_to_list(All)],
    Down = await_down(?BIG_ACTORS + 1),
    Ms = ms_since(T0),
    {Pongs, Errors} = lists:foldl(fun(_, {P, E}) -> receive {big, P1, E1} -> {P + P1, E + E1} end end,
                                  {0, 0}, lists:seq(1, ?BIG_ACTORS)),
    check(Ms, Down =:= ok andalso Pongs =:= ?BIG_ACTORS * ?BIG_PINGS andalso Errors =:= 0,
          "~p pongs (expected ~p), ~p from the wrong actor",
          [Pongs, ?BIG_ACTORS * ?BIG_PINGS, Errors]).

%% --- fjthrput -----------------------------------------------------------------------------

%% Theta comes in as an argument, so that sin() is computed per message.
fj_actor(Theta, Handled, Acc, Main) ->
    receive
        work ->
            S = math:sin(Theta),
            case Handled + 1 of
                ?FJTHRPUT_N -> Main ! {fj, ?FJTHRPUT_N, Acc + S * S};
                H -> fj_actor(Theta, H, Acc + S * S, Main)
            end
    end.

fj_send(_, 0) -> ok;
fj_send(All, N) -> [P ! work || P <- All], fj_send(All, N - 1).

fjthrput(Theta) ->
    Main = self(),
    T0 = now_ns(),
    All = [hot(fun() -> fj_actor(Theta, 0, 0.0, Main) end) || _ <- lists:seq(1, ?FJTHRPUT_ACTORS)],
    fj_send(All, ?FJTHRPUT_N),
    Down = await_down(?FJTHRPUT_ACTORS),
    Ms = ms_since(T0),
    Res = [receive {fj, H, A} -> {H, A} end || _ <- All],
    Handled = lists:sum([H || {H, _} <- Res]),
    check(Ms, Down =:= ok andalso Handled =:= ?FJTHRPUT_ACTORS * ?FJTHRPUT_N
              andalso element(2, hd(Res)) > 0,
          "~p messages handled, expected ~p", [Handled, ?FJTHRPUT_ACTORS * ?FJTHRPUT_N]).

%% --- fib and skynet: one process per call of a recursion ------------------------------------

fib_node() ->
    receive
        {request, N, Parent} when N =< 2 ->
            Parent ! {response, 1};
        {request, N, Parent} ->
            Self = self(),
            spawn(fun fib_node/0) ! {request, N - 1, Self},
            spawn(fun fib_node/0) ! {request, N - 2, Self},
            Parent ! {response, sum_answers(2, 0)}
    end.

sky_node() ->
    receive
        {request, Num, 1, Parent} ->
            Parent ! {response, Num};
        {request, Num, Size, Parent} ->
            Self = self(),
            Step = Size div ?SKYNET_FANOUT,
            [spawn(fun sky_node/0) ! {request, Num + I * Step, Step, Self}
             || I <- lists:seq(0, ?SKYNET_FANOUT - 1)],
            Parent ! {response, sum_answers(?SKYNET_FANOUT, 0)}
    end.

sum_answers(0, Sum) -> Sum;
sum_answers(N, Sum) -> receive {response, V} -> sum_answers(N - 1, Sum + V) end.

fib() ->
    T0 = now_ns(),
    spawn(fun fib_node/0) ! {request, ?FIB_N, self()},
    R = receive {response, V} -> V end,
    check(ms_since(T0), R =:= ?FIB_EXPECT, "fib(~p) = ~p, expected ~p", [?FIB_N, R, ?FIB_EXPECT]).

skynet() ->
    T0 = now_ns(),
    spawn(fun sky_node/0) ! {request, 0, ?SKYNET_LEAVES, self()},
    R = receive {response, V} -> V end,
    check(ms_since(T0), R =:= ?SKYNET_EXPECT, "sum ~p, expected ~p", [R, ?SKYNET_EXPECT]).

%% --- fan-in -------------------------------------------------------------------------------

%% P producers share FANIN_TOTAL messages to one consumer, FANIN_CHUNK per go message they send
%% themselves. The consumer sums the sequence numbers to check nothing was lost.
consumer(Received, Sum, Main) ->
    receive
        {data, V} when Received + 1 =:= ?FANIN_TOTAL -> Main ! {fanin, Received + 1, Sum + V};
        {data, V} -> consumer(Received + 1, Sum + V, Main)
    end.

producer_loop(Consumer, Left) ->
    receive
        go ->
            N = min(Left, ?FANIN_CHUNK),
            send_data(Consumer, Left, Left - N),
            case Left - N of
                0 -> ok;
                L -> self() ! go, producer_loop(Consumer, L)
            end
    end.

send_data(_, Stop, Stop) -> ok;
send_data(Consumer, V, Stop) -> Consumer ! {data, V}, send_data(Consumer, V - 1, Stop).

fanin_once(P) ->
    Main = self(),
    Per = ?FANIN_TOTAL div P,
    T0 = now_ns(),
    Consumer = hot(fun() -> consumer(0, 0, Main) end),
    Producers = [hot(fun() -> producer_loop(Consumer, Per) end) || _ <- lists:seq(1, P)],
    [X ! go || X <- Producers],
    Down = await_down(P + 1),
    Ms = ms_since(T0),
    {Received, Sum} = receive {fanin, R, S} -> {R, S} end,
    check(Ms, Down =:= ok andalso Received =:= ?FANIN_TOTAL andalso Sum =:= P * (Per * (Per + 1) div 2),
          "received ~p, expected ~p", [Received, ?FANIN_TOTAL]).

fanin(A) ->
    lists:foldl(fun(P, Failed) ->
                        Name = "fanin_" ++ integer_to_list(P),
                        case selected(A, Name) of
                            false -> Failed;
                            true ->
                                case reps(A, Name, fun() -> fanin_once(P) end) of
                                    {ok, Ms} ->
                                        print(Name, ?FANIN_TOTAL / (Ms / 1.0e3) / 1.0e6, "Mmsg/s"),
                                        Failed;
                                    error -> true
                                end
                        end
                end, false, [1, 2, 4, 8]).

%% --- latency and idle CPU -----------------------------------------------------------------

%% latency: this process sleeps ~1 ms, then sends one message to a process waiting in
%% receive, which records (time it runs - send time), warm-up dropped. Troupe's latency is the
%% same program (an actor woken by a runtime timer sends to another). Troupe's wakeup, whose
%% sender is a thread outside the runtime, has no Erlang program: every process runs on
%% Erlang's schedulers.
lat_actor(N, Samples, Main) when N =:= ?LATENCY_WARMUP + ?LATENCY_SAMPLES ->
    Main ! {samples, Samples};
lat_actor(N, Samples, Main) ->
    receive
        {stamp, Sent} ->
            D = now_ns() - Sent,
            lat_actor(N + 1, if N >= ?LATENCY_WARMUP -> [D | Samples]; true -> Samples end, Main)
    end.

latency_once() ->
    Main = self(),
    X = spawn(fun() -> lat_actor(0, [], Main) end),
    [begin timer:sleep(1), X ! {stamp, now_ns()} end
     || _ <- lists:seq(1, ?LATENCY_WARMUP + ?LATENCY_SAMPLES)],
    Sorted = list_to_tuple(lists:sort(receive {samples, S} -> S end)),
    N = tuple_size(Sorted),
    {N =:= ?LATENCY_SAMPLES, [percentile(Sorted, N, P) / 1.0e3 || P <- [50, 90, 99, 100]]}.

%% p50, p90, p99 and max: each the median over --reps runs (harness.h's bench_latency_reps).
latency(#{reps := R}) ->
    Runs = [begin erlang:garbage_collect(), latency_once() end || _ <- lists:seq(1, R)],
    Names = ["latency_p50", "latency_p90", "latency_p99", "latency_max"],
    [print(Name, median([lists:nth(I, V) || {_, V} <- Runs]), "us")
     || {I, Name} <- lists:zip(lists:seq(1, 4), Names)],
    lists:all(fun({Ok, _}) -> Ok end, Runs).

%% bench_percentile: nearest rank.
percentile(V, N, P) ->
    Rank = trunc(P / 100 * N + 0.999999),
    element(if Rank =:= 0 -> 1; Rank > N -> N; true -> Rank end, V).

idle_actor(Pokes) ->
    receive
        poke -> idle_actor(Pokes + 1);
        stop -> ok
    end.

%% idle_cpu: IDLE_ACTORS processes each handle one message, then nothing happens for IDLE_MS;
%% the OS process's CPU time (every thread, user + system) over that window in percent of one
%% core. statistics(runtime) counts whole milliseconds (0.05 % steps over 2 s, often reading
%% 0 for a runtime that does use CPU), and reading /proc from inside the VM wakes its dirty
%% I/O schedulers (~1 ms of CPU a reading), so a shell outside the VM reads every VM thread's
%% run time in ns (/proc/PID/task/*/schedstat: the sum getrusage gives Troupe, Go and CAF)
%% at both ends of the window, while the VM waits for its answer without a timer of its own.
idle_cpu() ->
    All = [spawn(fun() -> idle_actor(0) end) || _ <- lists:seq(1, ?IDLE_ACTORS)],
    [P ! poke || P <- All],
    %% both samples are printed at the end: a line read mid-window would wake the VM
    Sample = "\"$(date +%s%N) $(cat /proc/" ++ os:getpid() ++ "/task/*/schedstat"
             " | awk '{s += $1} END {if (NR) printf \"%.0f\", s}')\"",
    Script = "sleep 0.1; a=" ++ Sample ++ "; sleep "
             ++ float_to_list(?IDLE_MS / 1000, [{decimals, 3}]) ++ "; b=" ++ Sample
             ++ "; echo \"$a\"; echo \"$b\"",
    Port = open_port({spawn_executable, "/bin/sh"}, [{args, ["-c", Script]}, exit_status,
                                                     {line, 256}]),
    Lines = port_lines(Port, []),
    [P ! stop || P <- All],
    case [integers(L) || L <- Lines] of
        [[T0, C0], [T1, C1]] when T1 > T0, C1 >= C0 ->
            io:format("idle_cpu: ~.6f %~n", [100 * (C1 - C0) / (T1 - T0)]), % bench_print_idle
            true;
        _ ->
            io:format(standard_error, "idle_cpu: could not read the VM's CPU time from "
                      "/proc/~s/task/*/schedstat: got ~p~n", [os:getpid(), Lines]),
            false
    end.

%% The integers of a line, or {bad, Line} when it holds something else.
integers(L) ->
    try [list_to_integer(F) || F <- string:lexemes(L, " ")]
    catch error:badarg -> {bad, L}
    end.

port_lines(Port, Acc) ->
    receive
        {Port, {data, {eol, L}}} -> port_lines(Port, [L | Acc]);
        {Port, {exit_status, 0}} -> lists:reverse(Acc);
        {Port, {exit_status, S}} -> lists:reverse([lists:flatten(io_lib:format("exit ~p", [S])) | Acc])
    end.

%% --- harness: harness.h's, in Erlang ------------------------------------------------------

parse(["--only", V | T], A) -> parse(T, A#{only => V});
parse(["--reps", V | T], A) -> parse(T, A#{reps => list_to_integer(V)});
parse(["--workers", V | T], A) -> parse(T, A#{workers => list_to_integer(V)});
parse([], A = #{reps := R}) when R >= 1, R =< ?MAX_REPS -> A;
parse(_, _) -> usage.

%% bench_selected: when one of the name and --only is a prefix of the other.
selected(#{only := none}, _) -> true;
selected(#{only := Only}, Name) ->
    lists:prefix(Only, Name) orelse lists:prefix(Name, Only).

print(Name, Value, Unit) ->
    io:format("~s: ~.3f ~s~n", [Name, float(Value), Unit]).

median(V) ->
    S = list_to_tuple(lists:sort(V)),
    N = tuple_size(S),
    case N rem 2 of
        1 -> element(N div 2 + 1, S);
        0 -> (element(N div 2, S) + element(N div 2 + 1, S)) / 2
    end.

%% Runs Fn (-> {Ms, ok | {error, Why}}) --reps times: {ok, median ms}, or error after saying why.
reps(#{reps := R}, Name, Fn) -> reps(R, Name, Fn, []).

reps(0, _, _, Ms) -> {ok, median(Ms)};
reps(R, Name, Fn, Ms) ->
    erlang:garbage_collect(),
    case Fn() of
        {M, ok} -> reps(R - 1, Name, Fn, [M | Ms]);
        {_, {error, Why}} ->
            io:format(standard_error, "~s: ~s~n~s: FAILED (wrong result)~n", [Name, Why, Name]),
            error
    end.

timed(A, Name, Fn) ->
    case reps(A, Name, Fn) of
        {ok, Ms} -> print(Name, Ms, "ms"), ok;
        error -> error
    end.

run(Args) ->
    case parse(Args, #{only => none, reps => 5, workers => 0}) of
        usage ->
            io:format(standard_error, "usage: savina_erlang [--only NAME] [--reps N (1..~p)] "
                      "[--workers N]~n", [?MAX_REPS]),
            2;
        A -> run_all(A)
    end.

run_all(A = #{workers := W}) ->
    Schedulers = erlang:system_info(schedulers),
    Online = if W > 0, W < Schedulers -> W; true -> Schedulers end,
    erlang:system_flag(schedulers_online, Online),
    io:format("# erlang OTP ~s (erts ~s): ~p schedulers online, median of ~p reps~n",
              [erlang:system_info(otp_release), erlang:system_info(version), Online,
               maps:get(reps, A)]),
    Theta = 37.2,
    Timed = [{"pingpong", fun pingpong/0}, {"counting", fun counting/0},
             {"threadring", fun threadring/0}, {"chameneos", fun chameneos/0},
             {"big", fun big/0}, {"fjthrput", fun() -> fjthrput(Theta) end},
             {"fib", fun fib/0}, {"skynet", fun skynet/0}],
    R1 = [timed(A, Name, Fn) || {Name, Fn} <- Timed, selected(A, Name)],
    R2 = fanin(A),
    R3 = selected(A, "latency") andalso not latency(A),
    R4 = selected(A, "idle_cpu") andalso not idle_cpu(),
    case lists:member(error, R1) orelse R2 orelse R3 orelse R4 of
        true -> 1;
        false -> 0
    end.

%% Entry point (erl -s savina_erl main -extra ARGS): runs in a fresh process, not in init's.
main() ->
    Args = init:get_plain_arguments(),
    spawn(fun() -> erlang:halt(run(Args)) end),
    ok.
