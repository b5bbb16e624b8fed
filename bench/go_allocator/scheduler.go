// The -mode scheduler placement: the upstream allocator driven as kube-scheduler's
// scheduling cycle drives the DynamicResources plugin for a pod with one claim
// (pkg/scheduler/schedule_one.go, v1.37):
//
//   - PreFilter once per pod: NewAllocator over the allocated state (session.preFilter);
//   - Filter on every node in parallel (parallelism goroutines, 16 by default,
//     in chunks as the scheduler's Parallelizer cuts them), starting at the node
//     where the previous pod's search stopped (nextStartNodeIndex), until
//     numFeasibleNodesToFind nodes passed; then the search is cancelled;
//   - one node is picked. kube-scheduler scores the feasible nodes and picks
//     among the best at random; no plugin prefers any node here (the pods ask
//     for nothing else and the DRA plugin scores only prioritized lists), so this
//     takes the first feasible node in search order, which keeps a run repeatable
//     in what it measures. The allocation computed by that node's Filter is
//     assumed (Reserve) before the next pod.
//
// The other Filter plugins of a pod that asks for nothing but a claim cost next
// to nothing and are left out.
package main

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/structured"
)

// kube-scheduler's defaults: parallelism (KubeSchedulerConfiguration), and the
// floor and minimum percentage of numFeasibleNodesToFind.
const (
	defaultParallelism               = 16
	minFeasibleNodesToFind           = 100
	minFeasibleNodesPercentageToFind = 5
)

type schedulerOptions struct {
	parallelism int
	percentage  int // percentageOfNodesToScore; 0: adaptive
}

// numFeasibleNodesToFind is how many feasible nodes the scheduler looks for
// before it stops filtering: all nodes below 100; else the percentage (adaptive
// by default: 50 - nodes/125, at least 5) of the nodes, at least 100.
func numFeasibleNodesToFind(percentage, nodes int) int {
	if nodes < minFeasibleNodesToFind {
		return nodes
	}
	if percentage == 0 {
		percentage = max(50-nodes/125, minFeasibleNodesPercentageToFind)
	}
	return max(nodes*percentage/100, minFeasibleNodesToFind)
}

// parallelizeUntil runs work(0..pieces-1) on at most workers goroutines, in
// chunks of max(1, min(sqrt(pieces), pieces/workers+1)) pieces, and stops
// starting pieces once ctx is done: the chunking of the scheduler's Parallelizer.
func parallelizeUntil(ctx context.Context, workers, pieces int, work func(int)) {
	if pieces == 0 {
		return
	}
	chunk := max(1, min(int(math.Sqrt(float64(pieces))), pieces/workers+1))
	chunks := (pieces + chunk - 1) / chunk
	next := make(chan int, chunks)
	for i := range chunks {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range min(workers, chunks) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				for p := c * chunk; p < min((c+1)*chunk, pieces); p++ {
					if ctx.Err() != nil {
						return
					}
					work(p)
				}
			}
		}()
	}
	wg.Wait()
}

// fit is a node that passed Filter: its offset in this pod's search order, and
// the allocation its Allocate call made (the plugin keeps it for Reserve).
type fit struct {
	offset int
	node   *v1.Node
	result resourceapi.AllocationResult
}

// filterNodes is findNodesThatPassFilters for one claim: the feasible nodes found
// (at most toFind) and how many nodes were processed (feasible plus rejected, the
// scheduler's measure for where the next search starts).
func filterNodes(s *session, allocator structured.Allocator, claim *resourceapi.ResourceClaim, start, toFind, parallelism int) ([]fit, int, error) {
	ctx, cancel := context.WithCancelCause(s.ctx)
	defer cancel(nil)
	enough := errors.New("found enough feasible nodes")
	feasible := make([]fit, toFind)
	var found, rejected atomic.Int32
	var fatal error
	var fatalOnce sync.Once
	one := []*resourceapi.ResourceClaim{claim}
	n := len(s.nodes)
	check := func(i int) {
		node := s.nodes[(start+i)%n]
		results, err := s.allocate(ctx, allocator, node, one)
		switch {
		case err != nil && ctx.Err() != nil, errors.Is(err, structured.ErrFailedAllocationOnNode), err == nil && results == nil:
			rejected.Add(1) // unschedulable on this node (a cancelled call counts so too)
		case err != nil:
			fatalOnce.Do(func() { fatal = err })
			cancel(err)
		default:
			k := found.Add(1)
			if int(k) > toFind {
				cancel(enough)
				found.Add(-1)
			} else {
				feasible[k-1] = fit{offset: i, node: node, result: results[0]}
			}
		}
	}
	parallelizeUntil(ctx, parallelism, n, check)
	if fatal != nil {
		return nil, 0, fatal
	}
	got := int(found.Load())
	return feasible[:got], got + int(rejected.Load()), nil
}

// runScheduler places the mix one pod at a time as the scheduling cycle does.
func runScheduler(s *session, opts schedulerOptions) error {
	if opts.parallelism < 1 {
		opts.parallelism = defaultParallelism
	}
	n := len(s.nodes)
	toFind := numFeasibleNodesToFind(opts.percentage, n)
	s.f.Parallelism, s.f.NodesToFind = opts.parallelism, toFind
	next, feasibleTotal := 0, 0
	for i, claim := range s.claims {
		began := time.Now()
		allocator, err := s.preFilter()
		if err != nil {
			return err
		}
		feasible, processed, err := filterNodes(s, allocator, claim, next, toFind, opts.parallelism)
		if err != nil {
			return err
		}
		if n > 0 {
			next = (next + processed) % n
		}
		feasibleTotal += len(feasible)
		if len(feasible) > 0 {
			first := feasible[0]
			for _, f := range feasible[1:] {
				if f.offset < first.offset {
					first = f
				}
			}
			s.assume(i, first.node.Name, first.result)
		}
		s.latencies = append(s.latencies, time.Since(began))
	}
	if len(s.claims) > 0 {
		s.f.FeasibleMean = float64(feasibleTotal) / float64(len(s.claims))
	}
	return nil
}
