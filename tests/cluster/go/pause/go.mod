module forgereplay.test/cluster/pause

go 1.26.0
