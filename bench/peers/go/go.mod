module troupe/bench/peers/go

go 1.19
