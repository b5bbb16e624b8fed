// Command go_allocator places claims with the upstream structured allocator
// (k8s.io/dynamic-resource-allocation at the pinned Kubernetes version) the way
// kube-scheduler's DynamicResources plugin drives it, and prints JSON figures.
//
// With -conformance FILE it runs the project's allocator cases instead (conformance.go).
//
// Input: the JSON that bench/allocator_side_by_side.py writes: nodes (names, in
// order), deviceClasses, resourceSlices and, per mix, the claims to place. It is
// parsed before any timer starts.
//
// Per claim, as the plugin does per pod: PreFilter gathers the allocated state
// (a fresh copy of the allocated devices) and calls NewAllocator once with the
// features of the 1.37 default gates; Filter calls Allocate(node, claim) per
// node; the chosen node's devices count as allocated for the following claims
// (Reserve's assumed allocation). Two ways to try the nodes (-mode):
//
//   - loop: node after node in name order, the first node with a result wins
//     (first fit, one goroutine, no scoring);
//   - scheduler: as kube-scheduler's scheduling cycle does (scheduler.go): Filter
//     on -parallelism goroutines (16, its default), starting where the previous
//     pod's search stopped, until numFeasibleNodesToFind feasible nodes are found.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// features are AllocatorFeatures(fts) of kube-scheduler 1.37 with its default
// gates: DRAConsumableCapacity is beta (on), DRAListTypeAttributes is alpha
// (off), DRAFractionalCapacityRange is beta but off, as are the new alpha gates.
// With these NewAllocator picks the "incubating" implementation.
var features = structured.Features{
	AdminAccess:            true,
	PrioritizedList:        true,
	PartitionableDevices:   true,
	DeviceTaints:           true,
	DeviceBindingAndStatus: true,
	ConsumableCapacity:     true,
}

type input struct {
	Nodes          []string                                `json:"nodes"`
	DeviceClasses  []*resourceapi.DeviceClass              `json:"deviceClasses"`
	ResourceSlices []*resourceapi.ResourceSlice            `json:"resourceSlices"`
	Mixes          map[string][]*resourceapi.ResourceClaim `json:"mixes"`
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("deviceclass %q not found", name)
}

type figures struct {
	Mix            string  `json:"mix"`
	Mode           string  `json:"mode"`
	Claims         int     `json:"claims"`
	Allocated      int     `json:"allocated"`
	Failed         int     `json:"failed"`
	TotalS         float64 `json:"total_s"`
	CPUS           float64 `json:"cpu_s"`
	ClaimsPerS     float64 `json:"claims_per_s"`
	P50Ms          float64 `json:"p50_ms"`
	P99Ms          float64 `json:"p99_ms"`
	AllocateCalls  int     `json:"allocate_calls"`
	AllocateHits   int     `json:"allocate_hits"`
	AllocateMeanUs float64 `json:"allocate_mean_us"`
	AllocateHitUs  float64 `json:"allocate_hit_mean_us"`
	AllocateMissUs float64 `json:"allocate_miss_mean_us"`
	NewAllocatorUs float64 `json:"new_allocator_mean_us"`
	ParseS         float64 `json:"parse_s"`
	Allocator      string  `json:"allocator"`
	GoMaxProcs     int     `json:"gomaxprocs"`
	// The scheduler mode's own: its goroutines, the feasible nodes it looks for
	// per claim, and those it found on average.
	Parallelism  int      `json:"parallelism,omitempty"`
	NodesToFind  int      `json:"nodes_to_find,omitempty"`
	FeasibleMean float64  `json:"feasible_mean,omitempty"`
	Placements   []string `json:"placements,omitempty"`
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(q*float64(len(sorted))))
	return float64(sorted[i]) / float64(time.Millisecond)
}

// setDefaults fills in what the API server's defaulting would have set on a stored
// claim and the allocator relies on: allocationMode ExactCount, count 1.
func setDefaults(claim *resourceapi.ResourceClaim) {
	defaultCount := func(mode *resourceapi.DeviceAllocationMode, count *int64) {
		if *mode == "" {
			*mode = resourceapi.DeviceAllocationModeExactCount
		}
		if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
	}
	for i := range claim.Spec.Devices.Requests {
		r := &claim.Spec.Devices.Requests[i]
		if r.Exactly != nil {
			defaultCount(&r.Exactly.AllocationMode, &r.Exactly.Count)
		}
		for j := range r.FirstAvailable {
			defaultCount(&r.FirstAvailable[j].AllocationMode, &r.FirstAvailable[j].Count)
		}
	}
}

// placement is "node pool/device,..." for a placed claim.
func placement(node string, result resourceapi.AllocationResult) string {
	var devices []string
	for _, r := range result.Devices.Results {
		devices = append(devices, r.Pool+"/"+r.Device)
	}
	return node + " " + strings.Join(devices, ",")
}

// session is one mix's placement: the claims, what the plugin keeps across
// scheduling cycles (the class lister, the nodes, the CEL cache) and the devices
// allocated so far, with the figures measured while placing.
type session struct {
	ctx       context.Context
	claims    []*resourceapi.ResourceClaim
	classes   classLister
	slices    []*resourceapi.ResourceSlice
	nodes     []*v1.Node
	celCache  *cel.Cache
	allocated sets.Set[structured.DeviceID]
	f         *figures
	where     []string // per claim "node pool/device,...", "-" when not placed

	// Sums over Allocate calls; atomic because the scheduler mode calls it from
	// several goroutines.
	calls, hits       atomic.Int64
	allocateNs, hitNs atomic.Int64
	latencies         []time.Duration
	newAllocatorTime  time.Duration
}

// newSession prepares a mix: everything here happens before the timer (the
// plugin's informers and caches exist before the first pod is scheduled; the CEL
// cache's compiler environment is built by NewCache).
func newSession(in *input, mix string) (*session, error) {
	claims, ok := in.Mixes[mix]
	if !ok {
		return nil, fmt.Errorf("no mix %q in the input", mix)
	}
	for _, claim := range claims {
		setDefaults(claim)
	}
	s := &session{
		ctx:       context.Background(),
		claims:    claims,
		classes:   classLister{},
		slices:    in.ResourceSlices,
		nodes:     make([]*v1.Node, len(in.Nodes)),
		celCache:  cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity}),
		allocated: sets.New[structured.DeviceID](),
		f:         &figures{Mix: mix, Claims: len(claims), GoMaxProcs: runtime.GOMAXPROCS(0)},
		where:     make([]string, len(claims)),
		latencies: make([]time.Duration, 0, len(claims)),
	}
	for _, c := range in.DeviceClasses {
		s.classes[c.Name] = c
	}
	for i, name := range in.Nodes {
		s.nodes[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	for i := range s.where {
		s.where[i] = "-"
	}
	return s, nil
}

// preFilter is the plugin's PreFilter for one pod with one claim: the allocated
// state gathered as a fresh copy (claimTracker.GatherAllocatedState), then
// NewAllocator over every slice.
func (s *session) preFilter() (structured.Allocator, error) {
	start := time.Now()
	state := structured.AllocatedState{
		AllocatedDevices:         s.allocated.Clone(),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	allocator, err := structured.NewAllocator(s.ctx, features, state, s.classes, s.slices, s.celCache)
	s.newAllocatorTime += time.Since(start)
	if err == nil && s.f.Allocator == "" {
		s.f.Allocator = fmt.Sprintf("%T", allocator)
	}
	return allocator, err
}

// allocate is one Filter call's Allocate, counted and timed.
func (s *session) allocate(ctx context.Context, a structured.Allocator, node *v1.Node, claims []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	start := time.Now()
	results, err := a.Allocate(ctx, node, claims)
	took := int64(time.Since(start))
	s.calls.Add(1)
	s.allocateNs.Add(took)
	if err == nil && results != nil {
		s.hits.Add(1)
		s.hitNs.Add(took)
	}
	return results, err
}

// assume records claim i's allocation on node, as Reserve does before the next
// pod: its devices count as allocated from then on.
func (s *session) assume(i int, node string, result resourceapi.AllocationResult) {
	for _, r := range result.Devices.Results {
		if r.AdminAccess == nil || !*r.AdminAccess {
			s.allocated.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
		}
	}
	s.f.Allocated++
	s.where[i] = placement(node, result)
}

// runLoop places the mix as a plain loop: per claim PreFilter, then Allocate node
// after node in name order; the first node with a result wins (first fit, one
// goroutine, no scoring).
func runLoop(s *session) error {
	for i, claim := range s.claims {
		start := time.Now()
		allocator, err := s.preFilter()
		if err != nil {
			return err
		}
		one := []*resourceapi.ResourceClaim{claim}
		for _, node := range s.nodes {
			results, err := s.allocate(s.ctx, allocator, node, one)
			if err != nil {
				return fmt.Errorf("claim %s on node %s: %w", claim.Name, node.Name, err)
			}
			if results != nil {
				s.assume(i, node.Name, results[0])
				break
			}
		}
		s.latencies = append(s.latencies, time.Since(start))
	}
	return nil
}

// run places one mix in the given mode and returns its figures; only the
// placement itself is timed (the input was parsed before).
func run(in *input, mix string, mode string, opts schedulerOptions, withPlacements bool) (*figures, error) {
	s, err := newSession(in, mix)
	if err != nil {
		return nil, err
	}
	s.f.Mode = mode
	cpu0 := cpuSeconds()
	t0 := time.Now()
	switch mode {
	case "loop":
		err = runLoop(s)
	case "scheduler":
		err = runScheduler(s, opts)
	default:
		err = fmt.Errorf("unknown -mode %q (loop or scheduler)", mode)
	}
	if err != nil {
		return nil, err
	}
	total := time.Since(t0)
	s.f.CPUS = cpuSeconds() - cpu0
	s.finish(total, withPlacements)
	return s.f, nil
}

// finish fills in the figures from what the placement measured.
func (s *session) finish(total time.Duration, withPlacements bool) {
	f := s.f
	f.Failed = f.Claims - f.Allocated
	f.TotalS = total.Seconds()
	if total > 0 {
		f.ClaimsPerS = float64(f.Claims) / total.Seconds()
	}
	if withPlacements {
		f.Placements = s.where
	}
	slices.Sort(s.latencies)
	f.P50Ms = percentile(s.latencies, 0.5)
	f.P99Ms = percentile(s.latencies, 0.99)
	us := func(ns int64, n int64) float64 {
		if n == 0 {
			return 0
		}
		return float64(ns) / float64(n) / float64(time.Microsecond)
	}
	calls, hits := s.calls.Load(), s.hits.Load()
	f.AllocateCalls = int(calls)
	f.AllocateHits = int(hits)
	f.AllocateMeanUs = us(s.allocateNs.Load(), calls)
	f.AllocateHitUs = us(s.hitNs.Load(), hits)
	f.AllocateMissUs = us(s.allocateNs.Load()-s.hitNs.Load(), calls-hits)
	f.NewAllocatorUs = us(int64(s.newAllocatorTime), int64(f.Claims))
}

func main() {
	path := flag.String("input", "", "the cluster and claims JSON written by bench/allocator_side_by_side.py")
	mix := flag.String("mix", "", "which mix of the input to place")
	withPlacements := flag.Bool("placements", false, "also print where each claim went")
	mode := flag.String("mode", "loop", "how nodes are tried: loop (first fit, one goroutine) or scheduler (as kube-scheduler)")
	parallelism := flag.Int("parallelism", defaultParallelism, "with -mode scheduler: Filter goroutines (kube-scheduler's parallelism)")
	percentage := flag.Int("percentage", 0, "with -mode scheduler: percentageOfNodesToScore (0: kube-scheduler's adaptive default)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the placement to this file")
	cases := flag.String("conformance", "", "run every case of this allocator case file (YAML) and compare")
	only := flag.String("case", "", "with -conformance: only the case of this name")
	asJSON := flag.Bool("json", false, "with -conformance: one JSON object per case and variant")
	flag.Parse()
	if *cases != "" {
		disagreements, err := runConformance(*cases, *only, *asJSON, os.Stdout)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if disagreements > 0 {
			fmt.Fprintf(os.Stderr, "%d disagreement(s) with upstream\n", disagreements)
			os.Exit(1)
		}
		return
	}
	if *path == "" || *mix == "" {
		fmt.Fprintln(os.Stderr, "usage: go_allocator -input FILE -mix NAME [-mode loop|scheduler] [-parallelism N] [-percentage P] [-placements] [-cpuprofile FILE]\n"+
			"       go_allocator -conformance CASES.yaml [-case NAME] [-json]")
		os.Exit(2)
	}
	started := time.Now()
	data, err := os.ReadFile(*path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var in input
	if err := json.Unmarshal(data, &in); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", *path, err)
		os.Exit(1)
	}
	parse := time.Since(started)
	if *cpuProfile != "" {
		out, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(out)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	opts := schedulerOptions{parallelism: *parallelism, percentage: *percentage}
	f, err := run(&in, *mix, *mode, opts, *withPlacements)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	f.ParseS = parse.Seconds()
	out, _ := json.Marshal(f)
	fmt.Println(string(out))
}
